//! Helpers for the pool limit and timeout tests: clients whose notices and final error the
//! test can read. (PostgreSQL's side of a pool: `harness::Observer`; waiting with a
//! deadline: `harness::wait_for`.)
#![allow(dead_code)]

use std::future::poll_fn;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, Client, NoTls};

/// The harness's, re-exported for the files that name them from here.
#[allow(unused_imports)] // each test file uses a different part
pub use crate::harness::{error_text, scalar};

/// Assert that `task` is still running all through `window` (it is waiting for something).
pub async fn assert_still_waiting<T>(
    what: &str,
    task: &tokio::task::JoinHandle<T>,
    window: Duration,
) {
    let what = format!("{what} is still waiting");
    crate::harness::assert_stays(&what, window, || async { !task.is_finished() }).await;
}

/// What happened on a watched client connection.
#[derive(Debug)]
pub enum Event {
    /// A NoticeResponse's message.
    Notice(String),
    /// The connection ended: the error's SQLSTATE and message, if any.
    Closed(Option<String>),
}

/// A client whose connection's notices and end are reported on `events`.
pub struct Watched {
    pub client: Client,
    pub events: Events,
}

/// What a watched connection reports.
pub struct Events {
    rx: mpsc::UnboundedReceiver<Event>,
}

impl Events {
    /// Wait (bounded) for the connection to end; returns its error text ("" if none).
    pub async fn closed_within(&mut self, limit: Duration) -> String {
        let until = tokio::time::timeout(limit, async {
            while let Some(ev) = self.rx.recv().await {
                if let Event::Closed(why) = ev {
                    return why.unwrap_or_default();
                }
            }
            String::new()
        });
        until
            .await
            .unwrap_or_else(|_| panic!("connection still open after {limit:?}"))
    }

    /// Wait (bounded) for a notice; returns its message.
    pub async fn notice_within(&mut self, limit: Duration) -> String {
        let until = tokio::time::timeout(limit, self.rx.recv());
        match until
            .await
            .unwrap_or_else(|_| panic!("no notice within {limit:?}"))
        {
            Some(Event::Notice(m)) => m,
            Some(Event::Closed(why)) => panic!("connection closed before a notice: {why:?}"),
            None => panic!("connection task gone before a notice"),
        }
    }
}

/// Connect and drive the connection in a task that reports notices and how it ended.
pub async fn connect_watched(dsn: &str) -> Watched {
    let (client, mut connection) = tokio_postgres::connect(dsn, NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect {dsn}: {e}"));
    let (tx, events) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let ev = match poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notice(n))) => Event::Notice(n.message().to_string()),
                Some(Ok(_)) => continue,
                Some(Err(e)) => Event::Closed(Some(error_text(&e))),
                None => Event::Closed(None),
            };
            let end = matches!(ev, Event::Closed(_));
            let _ = tx.send(ev);
            if end {
                return;
            }
        }
    });
    Watched {
        client,
        events: Events { rx: events },
    }
}

/// The backend pid a client's next query runs on.
pub async fn backend_pid(c: &Client) -> i32 {
    scalar(c, "select \"pg_backend_pid\"()")
        .await
        .expect("pg_backend_pid")
        .parse()
        .expect("a pid")
}
