//! PostgreSQL's md5 password scheme: the stored hash and the salted challenge response.
use ::md5::{Digest, Md5};
use subtle::ConstantTimeEq;

/// Length of a hex md5 digest (what follows the `md5` prefix in pg_authid and in a response).
pub const HASH_HEX_LEN: usize = 32;

/// `md5(password + user)` as 32 lowercase hex chars (no `md5` prefix): what pg_authid stores after "md5".
pub fn password_hash(user: &str, password: &str) -> String {
    let mut h = Md5::new();
    h.update(password.as_bytes());
    h.update(user.as_bytes());
    hex(&h.finalize())
}

/// What a client sends in PasswordMessage for md5 auth: `"md5" + md5(hash_hex + salt)`,
/// where `hash_hex` is `password_hash(user, password)`.
pub fn salted_response(hash_hex: &str, salt: [u8; 4]) -> String {
    String::from_utf8_lossy(&salted_response_bytes(hash_hex, salt)).into_owned()
}

/// [`salted_response`] on the stack.
fn salted_response_bytes(hash_hex: &str, salt: [u8; 4]) -> [u8; 3 + HASH_HEX_LEN] {
    let mut h = Md5::new();
    h.update(hash_hex.as_bytes());
    h.update(salt);
    let mut out = [0u8; 3 + HASH_HEX_LEN];
    out[..3].copy_from_slice(b"md5");
    hex_into(&h.finalize(), &mut out[3..]);
    out
}

/// Check a client's md5 PasswordMessage payload (without the trailing NUL) in constant time.
pub fn verify_response(hash_hex: &str, salt: [u8; 4], response: &[u8]) -> bool {
    let expected = salted_response_bytes(hash_hex, salt);
    // Lengths are public (always 35 for a well-formed response); the contents are compared in constant time.
    expected[..].ct_eq(response).into()
}

/// Lowercase hex, as PostgreSQL prints md5 digests.
fn hex(bytes: &[u8]) -> String {
    let mut out = vec![0u8; bytes.len() * 2];
    hex_into(bytes, &mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// Lowercase hex of `bytes` into `out` (twice as long).
fn hex_into(bytes: &[u8], out: &mut [u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (&b, o) in bytes.iter().zip(out.chunks_exact_mut(2)) {
        o[0] = DIGITS[usize::from(b >> 4)];
        o[1] = DIGITS[usize::from(b & 0x0f)];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `SET password_encryption = 'md5'; CREATE ROLE md5user PASSWORD 'md5pass'` on PostgreSQL 15
    /// stores this in pg_authid.rolpassword.
    const PG_MD5USER: &str = "md57541d4e65fae11bd07f18dc6fe2b02bc";

    #[test]
    fn password_hash_matches_postgresql() {
        let h = password_hash("md5user", "md5pass");
        assert_eq!(h.len(), HASH_HEX_LEN);
        assert_eq!(format!("md5{h}"), PG_MD5USER);
    }

    #[test]
    fn password_hash_known_value() {
        // md5("") is the classic test vector.
        assert_eq!(password_hash("", ""), "d41d8cd98f00b204e9800998ecf8427e");
    }

    #[test]
    fn salted_response_is_md5_of_hash_and_salt() {
        let h = password_hash("md5user", "md5pass");
        let salt = [0x01, 0x02, 0x03, 0x04];
        let r = salted_response(&h, salt);
        assert!(r.starts_with("md5"));
        assert_eq!(r.len(), 3 + HASH_HEX_LEN);
        let mut m = Md5::new();
        m.update(h.as_bytes());
        m.update(salt);
        assert_eq!(&r[3..], hex(&m.finalize()));
    }

    #[test]
    fn verify_response_accepts_right_and_rejects_wrong() {
        let h = password_hash("md5user", "md5pass");
        let salt = [0xde, 0xad, 0xbe, 0xef];
        let good = salted_response(&h, salt);
        assert!(verify_response(&h, salt, good.as_bytes()));
        // Wrong salt, wrong password, truncated, empty, trailing NUL.
        assert!(!verify_response(&h, [0, 0, 0, 0], good.as_bytes()));
        let bad = salted_response(&password_hash("md5user", "nope"), salt);
        assert!(!verify_response(&h, salt, bad.as_bytes()));
        assert!(!verify_response(&h, salt, &good.as_bytes()[..34]));
        assert!(!verify_response(&h, salt, b""));
        let mut nul = good.clone().into_bytes();
        nul.push(0);
        assert!(!verify_response(&h, salt, &nul));
    }

    #[test]
    fn hex_is_lowercase() {
        assert_eq!(hex(&[0x00, 0x0f, 0xa0, 0xff]), "000fa0ff");
    }
}
