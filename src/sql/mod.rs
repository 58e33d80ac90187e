//! What pgcarpool knows of SQL text, below the client and the server: classify.rs (leading
//! keywords, statement splitting, internal statement names), facts.rs (its cheap answers for
//! one message, found once).
pub mod classify;
pub mod facts;
