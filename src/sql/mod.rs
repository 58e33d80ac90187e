//! What pgcarpool knows of SQL text, below the client and the server: classify.rs (leading
//! keywords, statement splitting, internal statement names), reads.rs (which texts only
//! read: read routing's judgement).
pub mod classify;
pub mod reads;
