//! Console-set state the rest of the pooler reads (DISABLE'd and PAUSE'd databases, the
//! commands run) and who may use the console (admin_users, stats_users).
use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::config::Config;
use crate::lock::Locked;

/// What a console user may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// admin_users: every command.
    Admin,
    /// stats_users: SHOW only.
    Stats,
}

/// The console role of `user`, None = not allowed.
pub fn role_of(cfg: &Config, user: &str) -> Option<Role> {
    if cfg.settings.admin_users.iter().any(|u| u == user) {
        Some(Role::Admin)
    } else if cfg.settings.stats_users.iter().any(|u| u == user) {
        Some(Role::Stats)
    } else {
        None
    }
}

/// Console-set state the rest of the pooler reads: DISABLE'd databases, PAUSE'd ones.
#[derive(Debug, Default)]
pub struct AdminState {
    /// Console commands run (SHOW STATS counts them on database pgbouncer).
    commands: AtomicU64,
    disabled: Mutex<BTreeSet<String>>,
    paused: Mutex<BTreeSet<String>>,
    paused_all: AtomicBool,
}

impl AdminState {
    /// Console commands run so far.
    pub fn commands(&self) -> u64 {
        self.commands.load(Ordering::Relaxed)
    }
    /// One more console command run.
    pub fn count_command(&self) {
        self.commands.fetch_add(1, Ordering::Relaxed);
    }

    /// DISABLE db: the login path refuses new clients of `db`.
    pub fn is_disabled(&self, db: &str) -> bool {
        self.disabled.locked().contains(db)
    }
    pub fn set_disabled(&self, db: &str, on: bool) {
        let mut g = self.disabled.locked();
        if on {
            g.insert(db.to_string());
        } else {
            g.remove(db);
        }
    }
    pub fn is_paused(&self, db: &str) -> bool {
        self.is_paused_all() || self.paused.locked().contains(db)
    }
    pub fn is_paused_all(&self) -> bool {
        self.paused_all.load(Ordering::Relaxed)
    }
    /// PAUSE / RESUME state, one for the console and the signals (SIGUSR1/SIGUSR2).
    pub(crate) fn set_paused(&self, db: Option<&str>, on: bool) {
        let mut g = self.paused.locked();
        match db {
            Some(db) if on => {
                g.insert(db.to_string());
            }
            Some(db) => {
                g.remove(db);
            }
            None => {
                self.paused_all.store(on, Ordering::Relaxed);
                if !on {
                    g.clear();
                }
            }
        }
    }
}
