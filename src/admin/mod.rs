//! admin
