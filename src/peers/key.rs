//! Cancel keys that name their instance, as PgBouncer 1.21+ lays them out.
//!
//! A key is BackendKeyData's 8 bytes: the 4-byte "process id" then the 4-byte secret, both
//! big-endian. With peering on, bytes 1 and 2 hold the owning instance's peer id (low byte
//! first) and the two low bits of byte 7 a hop budget (TTL): 3 when the key is handed out,
//! one less at every forward, dropped at 0. The sign bit of the process id is clear (some
//! clients, pg_basebackup among them, dislike negative pids) and so is its lowest bit (an
//! even pid: a query that signals pids it computes has the server report a client's as a
//! number that says which signal, `sql::signal`). 44 bits stay random.

/// A protocol 3.2 client's secret is the 4 bytes above and this many random bytes more:
/// 32 in all, as PostgreSQL 18's, which leaves 224 of the protocol's 256 to a pooler in
/// front that wraps the key with its own (as the protocol's documentation advises). Peering
/// needs nothing of them: the peer id and the hop budget stay in the first 8 bytes.
pub const KEY_REST_LEN: usize = 28;

/// The rest of a long secret.
pub type KeyRest = [u8; KEY_REST_LEN];

/// The two low bits of the last byte: how many more times the key may be forwarded.
pub const TTL_MASK: u8 = 0x03;

/// The largest peer id (14 bits, as PgBouncer).
pub const MAX_PEER_ID: u16 = 16383;

/// A cancel key: (process id, secret) as BackendKeyData carries them.
pub type Key = (i32, i32);

fn to_bytes(k: Key) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&k.0.to_be_bytes());
    b[4..].copy_from_slice(&k.1.to_be_bytes());
    b
}

fn from_bytes(b: [u8; 8]) -> Key {
    (
        i32::from_be_bytes([b[0], b[1], b[2], b[3]]),
        i32::from_be_bytes([b[4], b[5], b[6], b[7]]),
    )
}

/// A key made of `random` bytes; with `peer_id` > 0 it carries the id and a full TTL.
pub fn make(random: [u8; 8], peer_id: u16) -> Key {
    let mut b = random;
    if peer_id > 0 {
        b[1] = (peer_id & 0xff) as u8;
        b[2] = (peer_id >> 8) as u8;
        b[7] |= TTL_MASK;
    }
    b[0] &= 0x7f;
    b[3] &= 0xfe;
    from_bytes(b)
}

/// The peer id a key names (meaningful only when the key was made with peering on).
pub fn peer_id(k: Key) -> u16 {
    let b = to_bytes(k);
    u16::from(b[1]) | (u16::from(b[2]) << 8)
}

/// How many more forwards the key allows.
pub fn ttl(k: Key) -> u8 {
    to_bytes(k)[7] & TTL_MASK
}

/// The key with one forward spent; None when none is left.
pub fn spend_hop(k: Key) -> Option<Key> {
    let mut b = to_bytes(k);
    if b[7] & TTL_MASK == 0 {
        return None;
    }
    b[7] -= 1;
    Some(from_bytes(b))
}

/// The key as it was handed out (full TTL), to look it up among our own clients.
pub fn as_issued(k: Key) -> Key {
    let mut b = to_bytes(k);
    b[7] |= TTL_MASK;
    from_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peer_id_sits_in_bytes_1_and_2_and_the_ttl_in_byte_7() {
        let k = make([0xff; 8], 0x1234);
        let b = to_bytes(k);
        assert_eq!(b, [0x7f, 0x34, 0x12, 0xfe, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(peer_id(k), 0x1234);
        let k = make([0; 8], 1);
        assert_eq!(to_bytes(k), [0, 1, 0, 0, 0, 0, 0, 3]);
        assert_eq!(ttl(k), 3);
        assert!(k.0 >= 0);
    }

    #[test]
    fn without_peering_only_the_pids_sign_and_lowest_bits_are_touched() {
        let k = make([0x80, 1, 2, 3, 4, 5, 6, 0xfc], 0);
        assert_eq!(to_bytes(k), [0, 1, 2, 2, 4, 5, 6, 0xfc]);
        assert_eq!(k.0 % 2, 0);
    }

    #[test]
    fn a_key_may_be_forwarded_three_times() {
        let k = make([9; 8], 7);
        let k1 = spend_hop(k).unwrap();
        let k2 = spend_hop(k1).unwrap();
        let k3 = spend_hop(k2).unwrap();
        assert_eq!(ttl(k3), 0);
        assert_eq!(spend_hop(k3), None);
        assert_eq!(as_issued(k3), k);
        assert_eq!(peer_id(k3), 7);
    }
}
