//! The virtual session: what one client believes its PostgreSQL session holds, whichever
//! server runs its next transaction.
use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;

use super::prepared::Stmt;
use crate::server::Params;

#[derive(Debug, Clone, Default)]
pub struct VirtualSession {
    /// Session parameters (GUCs) the client set: from its startup packet and, for reported
    /// parameters, from the server's ParameterStatus while it ran the client's queries.
    pub params: Params,
    /// Named prepared statements: client name → statement.
    pub statements: HashMap<Bytes, Arc<Stmt>>,
}

impl VirtualSession {
    /// A ParameterStatus from the server while it ran this client's work.
    pub fn observe_parameter(&mut self, name: &str, value: &str) {
        if !crate::server::sync::is_read_only(name) {
            self.params.set(name, value);
        }
    }
}
