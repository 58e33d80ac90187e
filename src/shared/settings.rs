//! A pool's settings and login credential from the config in force.
use super::Shared;
use crate::config::{Config, DatabaseEntry};
use crate::pool::PoolSettings;
use crate::server::roles::SessionAttrs;
use crate::server::{Credential, HostList, ServerAddr, ServerTarget};

/// Resolve the settings of the pool of `server_user` (the user its servers log in as: the
/// database's forced `user=`, the client's user, or the auth_user) from the config
/// (per user > per database > global).
pub fn pool_settings(
    cfg: &Config,
    entry: &DatabaseEntry,
    server_user: &str,
    credential: Credential,
    shared: &Shared,
) -> PoolSettings {
    let s = &cfg.settings;
    let db = entry.name.as_str();
    let user = server_user.to_string();
    let mut startup_params = Vec::new();
    for (k, v) in [
        ("client_encoding", &entry.client_encoding),
        ("DateStyle", &entry.datestyle),
        ("TimeZone", &entry.timezone),
        ("application_name", &entry.application_name),
    ] {
        if let Some(v) = v {
            startup_params.push((k.to_string(), v.clone()));
        }
    }
    let port = if entry.port == 0 { 5432 } else { entry.port };
    // host=a,b,… port=p,q,…: a list of hosts (load_balance_hosts chooses among them,
    // target_session_attrs by role).
    let hosts: Vec<ServerAddr> = entry
        .host_ports()
        .into_iter()
        .map(|(h, p)| ServerAddr::new(h, p))
        .collect();
    let mode = cfg.pool_mode_for(db, &user);
    let mut attrs = SessionAttrs::parse(entry.target_session_attrs.as_deref());
    // read_routing: reads to the standbys, the rest to the primary. An entry whose
    // target_session_attrs asks for reads only keeps its meaning (no routing).
    let read_routing = entry.read_routing.unwrap_or(s.read_routing)
        && mode == crate::config::PoolMode::Transaction
        && hosts.len() > 1
        && matches!(
            attrs,
            SessionAttrs::Any | SessionAttrs::ReadWrite | SessionAttrs::Primary
        );
    if read_routing && attrs == SessionAttrs::Any {
        attrs = SessionAttrs::ReadWrite;
    }
    PoolSettings {
        read_routing,
        read_your_writes: entry.read_your_writes.unwrap_or(s.read_your_writes),
        mode,
        pool_size: cfg.pool_size_for(db, &user),
        min_pool_size: cfg.min_pool_size_for(db),
        reserve_pool_size: cfg.reserve_pool_for(db, &user),
        reserve_pool_timeout: s.reserve_pool_timeout,
        max_db_connections: cfg.max_db_connections_for(db),
        max_user_connections: cfg.max_user_connections_for(&user),
        server_lifetime: cfg.server_lifetime_for(db),
        server_idle_timeout: s.server_idle_timeout,
        server_connect_timeout: s.server_connect_timeout,
        server_login_retry: s.server_login_retry,
        server_check_delay: s.server_check_delay,
        server_check_query: s.server_check().map(str::to_string),
        server_reset_query: s.server_reset_query.clone(),
        server_reset_query_always: s.server_reset_query_always,
        server_round_robin: s.server_round_robin,
        cancel_wait_timeout: s.cancel_wait_timeout,
        query_wait_timeout: cfg.query_wait_timeout_for(db, &user),
        max_prepared_statements: s.max_prepared_statements,
        pin_error: entry.pin_mode.as_deref().unwrap_or(&s.pin_mode) == "error",
        pin_pool_size: s.pin_pool_size,
        role_check_interval: s.server_role_check_interval,
        target: ServerTarget {
            addr: hosts
                .first()
                .cloned()
                .unwrap_or_else(|| ServerAddr::new(None, port)),
            hosts: HostList::new(
                hosts,
                entry.load_balance_hosts.as_deref() != Some("disable"),
            )
            .with_roles(attrs, s.max_standby_lag),
            dbname: entry.dbname.clone().unwrap_or_else(|| db.to_string()),
            user,
            credential,
            startup_params,
            connect_query: entry.connect_query.clone(),
            scram_cache: Some(shared.scram.clone()),
            tls: shared.tls.load().connect.clone(),
            tcp: crate::net::sockopt::TcpTuning::from_settings(s),
            dns_nxdomain_ttl: s.dns_nxdomain_ttl,
        },
    }
}

/// What the pool logs in to the server with: the entry's password, else auth_file's
/// secret; for a SCRAM verifier, or a user auth_query found, what a client's login taught
/// (`learned`: SCRAM keys from its proof, or the md5 hash auth_query returned).
pub fn credential_for(
    cfg: &Config,
    entry: &DatabaseEntry,
    server_user: &str,
    learned: Option<Credential>,
) -> Credential {
    if let Some(pw) = &entry.password {
        return Credential::Plain(pw.clone());
    }
    match (cfg.auth.users.get(server_user), learned) {
        (Some(crate::config::Secret::Plain(p)), _) => Credential::Plain(p.clone()),
        (Some(crate::config::Secret::Md5(h)), _) => Credential::Md5Hash(h.clone()),
        (Some(crate::config::Secret::Scram(_)), Some(c @ Credential::ScramKeys { .. }))
            if entry.user.is_none() =>
        {
            c
        }
        (Some(crate::config::Secret::Scram(_)), _) => Credential::ScramVerifier,
        (None, Some(c)) if entry.user.is_none() => c,
        _ => Credential::None,
    }
}
