//! What pgcarpool knows of SQL text, below the client and the server: classify.rs (leading
//! keywords, statement splitting, internal statement names), facts.rs (its cheap answers for
//! one message, found once), reads.rs (which texts only read: read routing's judgement),
//! selfview.rs (what a session asks about itself, rewritten for the client's virtual
//! session).
pub mod classify;
pub mod facts;
pub mod reads;
pub mod selfview;
