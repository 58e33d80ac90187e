//! Memoised SCRAM key derivation, so PBKDF2 runs once per secret instead of once per login.
//!
//! One [`ScramCache`] lives in the app's shared state (no statics). Two bounded maps:
//! - `(password, salt, iterations) → (ClientKey, ServerKey)`: pgcarpool logging in to PostgreSQL
//!   with a plain-text password;
//! - `(user, password) → ScramVerifier`: a client logging in with SCRAM to a user whose auth_file
//!   secret is plain text (random salt, [`DEFAULT_ITERATIONS`], made once and reused).
//!
//! Map keys are HMAC-SHA-256 digests under a per-cache random key, so neither plain passwords nor
//! unsalted password hashes are kept. Locks are std mutexes held only for a map lookup or insert,
//! never across PBKDF2 or an `.await`. Two concurrent misses on one entry both compute it (same
//! result for keys; for verifiers the first stored wins and both callers get the stored one).
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::auth::scram::{self, DEFAULT_ITERATIONS, Key32};
use crate::config::auth_file::ScramVerifier;
use crate::lock::Locked;

/// Default bound on each map.
pub const DEFAULT_CAPACITY: usize = 10_000;

/// `(ClientKey, ServerKey)`.
pub type ClientKeys = (Key32, Key32);

/// Thread-safe, bounded memo of SCRAM derivations. Share it as `Arc<ScramCache>`.
pub struct ScramCache {
    /// Random key for the map-key HMAC.
    secret: [u8; 32],
    capacity: usize,
    keys: Mutex<HashMap<Key32, ClientKeys>>,
    verifiers: Mutex<HashMap<Key32, ScramVerifier>>,
    /// Iterations of the verifiers made here (scram_iterations; set at start and reload).
    iterations: std::sync::atomic::AtomicU32,
}

impl Default for ScramCache {
    fn default() -> Self {
        ScramCache::new()
    }
}

impl std::fmt::Debug for ScramCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScramCache")
            .field("capacity", &self.capacity)
            .field("keys", &self.keys.locked().len())
            .field("verifiers", &self.verifiers.locked().len())
            .finish_non_exhaustive()
    }
}

/// Insert, first evicting an arbitrary entry if the map is full (HashMap order is randomised per
/// map, so this is random eviction: O(1), no bookkeeping, good enough for a cache of secrets that
/// rarely exceeds its bound).
fn insert_bounded<V: Clone>(map: &mut HashMap<Key32, V>, capacity: usize, k: Key32, v: V) -> V {
    if let Some(existing) = map.get(&k) {
        return existing.clone();
    }
    if map.len() >= capacity.max(1)
        && let Some(victim) = map.keys().next().copied()
    {
        map.remove(&victim);
    }
    map.insert(k, v.clone());
    v
}

impl ScramCache {
    pub fn new() -> Self {
        ScramCache::with_capacity(DEFAULT_CAPACITY)
    }

    /// At most `capacity` entries in each map (at least 1).
    pub fn with_capacity(capacity: usize) -> Self {
        let mut secret = [0u8; 32];
        rand::fill(&mut secret[..]);
        ScramCache {
            secret,
            capacity: capacity.max(1),
            keys: Mutex::new(HashMap::new()),
            verifiers: Mutex::new(HashMap::new()),
            iterations: std::sync::atomic::AtomicU32::new(DEFAULT_ITERATIONS),
        }
    }

    /// scram_iterations: the iteration count of the verifiers made from now on (at least 1).
    pub fn set_iterations(&self, n: u32) {
        self.iterations
            .store(n.max(1), std::sync::atomic::Ordering::Relaxed);
    }

    fn iterations(&self) -> u32 {
        self.iterations.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Number of cached `(ClientKey, ServerKey)` pairs and verifiers.
    pub fn len(&self) -> (usize, usize) {
        (self.keys.locked().len(), self.verifiers.locked().len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == (0, 0)
    }

    /// Forget everything (e.g. after an auth_file reload).
    pub fn clear(&self) {
        self.keys.locked().clear();
        self.verifiers.locked().clear();
    }

    /// A SCRAM verifier for a user that does not exist, so the exchange looks like a real
    /// one (PgBouncer and PostgreSQL do the same: no user enumeration). Its salt is stable
    /// per user name for this process (a retry sees the same salt, as for a real user) and
    /// unguessable; no password matches its keys.
    pub fn dummy_verifier(&self, user: &str) -> ScramVerifier {
        let salt = self.map_key(b"dummy-salt", &[user.as_bytes()]);
        let mut stored_key = [0u8; 32];
        let mut server_key = [0u8; 32];
        rand::fill(&mut stored_key[..]);
        rand::fill(&mut server_key[..]);
        ScramVerifier {
            iterations: self.iterations(),
            salt: salt[..16].to_vec(),
            stored_key,
            server_key,
            macs: Default::default(),
        }
    }

    /// HMAC(secret, tag || for each part: len (u64 BE) || part): unambiguous and unguessable.
    fn map_key(&self, tag: &[u8], parts: &[&[u8]]) -> Key32 {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.secret)
            .expect("HMAC accepts keys of any length");
        mac.update(tag);
        for p in parts {
            mac.update(&(p.len() as u64).to_be_bytes());
            mac.update(p);
        }
        mac.finalize().into_bytes().into()
    }

    fn keys_key(&self, password: &str, salt: &[u8], iterations: u32) -> Key32 {
        self.map_key(
            b"keys",
            &[password.as_bytes(), salt, &iterations.to_be_bytes()],
        )
    }

    fn verifier_key(&self, user: &str, password: &str) -> Key32 {
        let n = self.iterations().to_be_bytes();
        self.map_key(b"verifier", &[user.as_bytes(), password.as_bytes(), &n])
    }

    /// A cached `(ClientKey, ServerKey)`, without computing.
    pub fn cached_client_keys(
        &self,
        password: &str,
        salt: &[u8],
        iterations: u32,
    ) -> Option<ClientKeys> {
        self.keys
            .locked()
            .get(&self.keys_key(password, salt, iterations))
            .copied()
    }

    /// `(ClientKey, ServerKey)` for a password and a server's salt and iteration count, memoised.
    /// A miss runs PBKDF2 on the calling thread: from async code use [`Self::client_keys_async`].
    pub fn client_keys(&self, password: &str, salt: &[u8], iterations: u32) -> ClientKeys {
        let k = self.keys_key(password, salt, iterations);
        if let Some(v) = self.keys.locked().get(&k).copied() {
            return v;
        }
        let v = scram::keys_from_password(password, salt, iterations);
        insert_bounded(&mut self.keys.locked(), self.capacity, k, v)
    }

    /// A cached verifier for a plain-text user secret, without computing.
    pub fn cached_verifier_for_plain(&self, user: &str, password: &str) -> Option<ScramVerifier> {
        self.verifiers
            .locked()
            .get(&self.verifier_key(user, password))
            .cloned()
    }

    /// A SCRAM verifier for a user whose stored secret is the plain-text `password`: random
    /// 16-byte salt, scram_iterations iterations (4096 by default), made on the first call and reused while cached (a changed
    /// password is a different entry). A miss runs PBKDF2 on the calling thread: from async code
    /// use [`Self::verifier_for_plain_async`].
    pub fn verifier_for_plain(&self, user: &str, password: &str) -> ScramVerifier {
        let k = self.verifier_key(user, password);
        if let Some(v) = self.verifiers.locked().get(&k).cloned() {
            return v;
        }
        let v = scram::verifier_with_random_salt(password, self.iterations());
        insert_bounded(&mut self.verifiers.locked(), self.capacity, k, v)
    }

    /// [`Self::client_keys`] for async code: a hit answers at once; a miss runs PBKDF2 on
    /// `tokio::task::spawn_blocking`, never on the reactor. Must be called within a tokio runtime.
    pub async fn client_keys_async(
        self: &Arc<Self>,
        password: &str,
        salt: &[u8],
        iterations: u32,
    ) -> ClientKeys {
        if let Some(v) = self.cached_client_keys(password, salt, iterations) {
            return v;
        }
        let (cache, password, salt) = (Arc::clone(self), password.to_owned(), salt.to_vec());
        off_reactor(move || cache.client_keys(&password, &salt, iterations)).await
    }

    /// [`Self::verifier_for_plain`] for async code: a miss runs on `spawn_blocking`.
    pub async fn verifier_for_plain_async(
        self: &Arc<Self>,
        user: &str,
        password: &str,
    ) -> ScramVerifier {
        if let Some(v) = self.cached_verifier_for_plain(user, password) {
            return v;
        }
        let (cache, user, password) = (Arc::clone(self), user.to_owned(), password.to_owned());
        off_reactor(move || cache.verifier_for_plain(&user, &password)).await
    }
}

/// Run CPU-heavy `f` on tokio's blocking pool. A panic in `f` is propagated; if the runtime is
/// shutting down and refuses the task, `f` runs here instead (correct, merely on this thread).
async fn off_reactor<T: Send + 'static>(f: impl FnOnce() -> T + Send + Clone + 'static) -> T {
    match tokio::task::spawn_blocking(f.clone()).await {
        Ok(v) => v,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => f(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::scram::{ClientCredential, ScramClient, ScramServer, keys_from_password};

    #[test]
    fn client_keys_are_memoised_and_correct() {
        let cache = ScramCache::new();
        assert!(cache.is_empty());
        assert_eq!(cache.cached_client_keys("pw", b"salt", 16), None);
        let k = cache.client_keys("pw", b"salt", 16);
        assert_eq!(k, keys_from_password("pw", b"salt", 16));
        assert_eq!(cache.cached_client_keys("pw", b"salt", 16), Some(k));
        assert_eq!(cache.client_keys("pw", b"salt", 16), k);
        assert_eq!(cache.len(), (1, 0));
        // Each input is part of the key.
        assert_ne!(cache.client_keys("pw", b"salt", 17), k);
        assert_ne!(cache.client_keys("pw", b"salt2", 16), k);
        assert_ne!(cache.client_keys("pw2", b"salt", 16), k);
        assert_eq!(cache.len(), (4, 0));
    }

    #[test]
    fn map_keys_are_unambiguous() {
        let cache = ScramCache::new();
        // "ab" + "c" and "a" + "bc" concatenate alike; the length prefixes keep them apart.
        assert_ne!(cache.keys_key("ab", b"c", 1), cache.keys_key("a", b"bc", 1));
        assert_ne!(cache.verifier_key("ab", "c"), cache.verifier_key("a", "bc"));
        // Two caches never share map keys (per-cache secret).
        assert_ne!(
            cache.keys_key("a", b"b", 1),
            ScramCache::new().keys_key("a", b"b", 1)
        );
    }

    #[test]
    fn map_keys_do_not_contain_the_password() {
        let cache = ScramCache::new();
        cache.client_keys("hunter2", b"salt", 1);
        cache.verifier_for_plain("u", "hunter2");
        let dbg = format!("{cache:?}");
        assert!(!dbg.contains("hunter2"), "{dbg}");
    }

    #[test]
    fn verifier_for_plain_is_made_once_per_user_and_password() {
        let cache = ScramCache::new();
        let v = cache.verifier_for_plain("alice", "pw");
        assert_eq!(v.iterations, DEFAULT_ITERATIONS);
        assert_eq!(v.salt.len(), scram::DEFAULT_SALT_LEN);
        assert_eq!(cache.verifier_for_plain("alice", "pw"), v);
        assert_eq!(
            cache.cached_verifier_for_plain("alice", "pw"),
            Some(v.clone())
        );
        // Another user or a changed password: another verifier, another salt.
        let bob = cache.verifier_for_plain("bob", "pw");
        assert_ne!(bob.salt, v.salt);
        assert_ne!(cache.verifier_for_plain("alice", "pw2").salt, v.salt);
        assert_eq!(cache.len(), (0, 3));
        // It verifies the password.
        assert_eq!(
            v,
            scram::verifier_from_password("pw", &v.salt, v.iterations)
        );
        cache.clear();
        assert!(cache.is_empty());
    }

    #[test]
    fn plain_user_logs_in_with_scram_and_keys_reach_the_server() {
        let cache = ScramCache::new();
        let v = cache.verifier_for_plain("alice", "pw");
        let mut server = ScramServer::new(v.clone());
        let mut client = ScramClient::new(ClientCredential::Password("pw".into()));
        let s1 = server.client_first(&client.client_first()).unwrap();
        let (salt, iterations) = scram::server_first_params(&s1).unwrap();
        let (ck, sk) = cache.client_keys("pw", &salt, iterations);
        let c2 = client.server_first_with_keys(&s1, ck, sk).unwrap();
        let s2 = server.client_final(&c2).unwrap();
        client.server_final(&s2).unwrap();
        assert_eq!(server.client_key(), Some(ck));
    }

    #[test]
    fn size_is_bounded() {
        let cache = ScramCache::with_capacity(3);
        for i in 0..10u32 {
            cache.client_keys("pw", b"s", i + 1);
            cache.verifier_for_plain(&format!("u{i}"), "pw");
            let (k, v) = cache.len();
            assert!(k <= 3 && v <= 3, "{k} {v}");
        }
        // The newest entry survives eviction.
        assert!(cache.cached_client_keys("pw", b"s", 10).is_some());
        assert!(cache.cached_verifier_for_plain("u9", "pw").is_some());
        // Capacity 0 still caches one entry and never panics.
        let tiny = ScramCache::with_capacity(0);
        tiny.client_keys("a", b"s", 1);
        tiny.client_keys("b", b"s", 1);
        assert_eq!(tiny.len(), (1, 0));
    }

    #[test]
    fn shared_between_threads() {
        let cache = Arc::new(ScramCache::new());
        let handles: Vec<_> = (0..4)
            .map(|i| {
                let cache = Arc::clone(&cache);
                std::thread::spawn(move || {
                    let k = cache.client_keys("pw", b"salt", 8);
                    let v = cache.verifier_for_plain("same", "pw");
                    cache.client_keys("pw", &[i], 8);
                    (k, v)
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(results.windows(2).all(|w| w[0].0 == w[1].0));
        // Racing misses may each make a verifier, but later lookups agree on one.
        let v = cache.verifier_for_plain("same", "pw");
        assert_eq!(cache.verifier_for_plain("same", "pw"), v);
        assert_eq!(cache.len(), (5, 1));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn async_wrappers_compute_off_the_reactor_and_cache() {
        let cache = Arc::new(ScramCache::new());
        let k = cache.client_keys_async("pw", b"salt", 16).await;
        assert_eq!(k, keys_from_password("pw", b"salt", 16));
        assert_eq!(cache.client_keys_async("pw", b"salt", 16).await, k);
        let v = cache.verifier_for_plain_async("alice", "pw").await;
        assert_eq!(cache.verifier_for_plain_async("alice", "pw").await, v);
        assert_eq!(cache.len(), (1, 1));
    }

    #[test]
    fn off_reactor_propagates_a_panic_without_running_again() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let runs = Arc::new(AtomicUsize::new(0));
        let r = Arc::clone(&runs);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            rt.block_on(off_reactor(move || {
                r.fetch_add(1, Ordering::SeqCst);
                panic!("in f");
            }))
        }));
        assert_eq!(
            caught.unwrap_err().downcast_ref::<&str>(),
            Some(&"in f"),
            "f's own panic"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn off_reactor_runs_here_when_the_runtime_refuses() {
        // A runtime shut down refuses blocking tasks: f runs on the calling thread.
        let gone = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let handle = gone.handle().clone();
        gone.shutdown_background();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let caller = std::thread::current().id();
        let ran_on = rt.block_on(async {
            let _in_gone = handle.enter();
            off_reactor(|| std::thread::current().id()).await
        });
        assert_eq!(ran_on, caller);
    }

    #[test]
    fn debug_shows_sizes_and_never_the_secret() {
        let cache = ScramCache::with_capacity(2);
        assert!(cache.is_empty());
        cache.client_keys("pw", b"salt", 16);
        assert!(!cache.is_empty());
        assert_eq!(
            format!("{cache:?}"),
            "ScramCache { capacity: 2, keys: 1, verifiers: 0, .. }"
        );
    }

    #[test]
    fn off_reactor_runs_on_the_blocking_pool() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let caller = std::thread::current().id();
        let ran_on = rt.block_on(off_reactor(|| std::thread::current().id()));
        assert_ne!(ran_on, caller);
    }
}
