//! `Observer`: PostgreSQL's side of a pool, from `pg_stat_activity` over a direct
//! superuser connection (its own backend belongs to `postgres` and is never counted).
use std::time::Duration;

use tokio_postgres::Client;
use tokio_postgres::types::ToSql;

use super::TempPostgres;

pub struct Observer {
    client: Client,
}

impl Observer {
    pub async fn new(pg: &TempPostgres) -> Observer {
        Observer {
            client: pg.connect("postgres", "postgres").await,
        }
    }

    /// Client backends of `user`.
    pub async fn backends(&self, user: &str) -> i64 {
        self.count("usename = $1", &[&user]).await
    }

    /// Client backends of `user` in `state` ('active', 'idle', 'idle in transaction'…).
    pub async fn backends_in_state(&self, user: &str, state: &str) -> i64 {
        self.count("usename = $1 and state = $2", &[&user, &state])
            .await
    }

    /// Client backends of `user` not idle (active, in a transaction, in COPY…).
    pub async fn busy(&self, user: &str) -> i64 {
        self.count("usename = $1 and state <> 'idle'", &[&user])
            .await
    }

    /// Client backends of `user` running a statement whose text contains `needle`.
    pub async fn running(&self, user: &str, needle: &str) -> i64 {
        self.count(
            "usename = $1 and state = 'active' and strpos(query, $2) > 0",
            &[&user, &needle],
        )
        .await
    }

    /// Wait (bounded: 10 s) until `n` backends of `user` run a statement containing
    /// `needle` (e.g. a `pg_sleep(30)` sent through the pooler has reached PostgreSQL).
    pub async fn wait_running(&self, user: &str, needle: &str, n: i64) {
        super::wait_for(
            &format!("{n} backends of {user} running {needle}"),
            Duration::from_secs(10),
            || async { self.running(user, needle).await == n },
        )
        .await;
    }

    /// Client backends connected to database `db` (not the superuser's).
    pub async fn backends_in_db(&self, db: &str) -> i64 {
        self.count("datname = $1 and usename <> 'postgres'", &[&db])
            .await
    }

    /// Client backends of any user in `state`.
    pub async fn all_in_state(&self, state: &str) -> i64 {
        self.count("state = $1", &[&state]).await
    }

    /// Backend pids of `user`.
    pub async fn pids(&self, user: &str) -> Vec<i32> {
        let rows = self
            .client
            .query(
                "select pid from pg_stat_activity where usename = $1 \
                 and backend_type = 'client backend' order by pid",
                &[&user],
            )
            .await
            .expect("list backends");
        rows.iter().map(|r| r.get(0)).collect()
    }

    /// Terminate every backend of `user` (pg_terminate_backend); how many were signalled.
    pub async fn terminate(&self, user: &str) -> i64 {
        self.client
            .query_one(
                "select count(pg_terminate_backend(pid)) from pg_stat_activity \
                 where usename = $1 and backend_type = 'client backend'",
                &[&user],
            )
            .await
            .expect("terminate backends")
            .get(0)
    }

    /// Client backends (not this observer's) matching the SQL condition `cond`.
    pub async fn count(&self, cond: &str, params: &[&(dyn ToSql + Sync)]) -> i64 {
        let sql = format!(
            "select count(*) from pg_stat_activity where backend_type = 'client backend' \
             and pid <> pg_backend_pid() and ({cond})"
        );
        self.client
            .query_one(&sql, params)
            .await
            .expect("count backends")
            .get(0)
    }
}
