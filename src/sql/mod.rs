//! What pgcarpool knows of SQL text, below the client and the server: classify.rs (leading
//! keywords, statement splitting, internal statement names), facts.rs (its cheap answers for
//! one message, found once), reads.rs (which texts only read: read routing's judgement),
//! selfview.rs (what a session asks about itself, rewritten for the client's virtual
//! session), signal.rs (signals to pids a query computes: marks the server reports),
//! begin.rs (the transaction starts pgcarpool answers itself: `deferred_begin`).
pub mod begin;
pub mod classify;
pub mod facts;
pub mod reads;
pub mod selfview;
pub mod signal;

/// For the classifier's generated tests: a seeded xorshift whose `next(n)` picks a number
/// below `n` (the same texts every run).
#[cfg(test)]
pub(crate) fn seeded_picks(mut seed: u64) -> impl FnMut(usize) -> usize {
    move |n| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    }
}
