//! What pgcarpool knows of SQL text, below the client and the server: classify.rs (leading
//! keywords, statement splitting, internal statement names).
pub mod classify;
