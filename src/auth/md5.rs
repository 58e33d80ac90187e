//! PostgreSQL's md5 password scheme.

/// `md5(password + user)` as 32 lowercase hex chars (no `md5` prefix): what pg_authid stores after "md5".
pub fn password_hash(user: &str, password: &str) -> String {
    let _ = (user, password);
    todo!()
}

/// What a client sends in PasswordMessage for md5 auth: `"md5" + md5(hash_hex + salt)`,
/// where `hash_hex` is `password_hash(user, password)`.
pub fn salted_response(hash_hex: &str, salt: [u8; 4]) -> String {
    let _ = (hash_hex, salt);
    todo!()
}

/// Check a client's md5 PasswordMessage payload (without the trailing NUL) in constant time.
pub fn verify_response(hash_hex: &str, salt: [u8; 4], response: &[u8]) -> bool {
    let _ = (hash_hex, salt, response);
    todo!()
}
