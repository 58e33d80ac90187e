//! SCRAM tests: RFC 7677's vector, PostgreSQL-made verifiers, round trips, hostile input.
use super::*;

// RFC 7677 section 3: user "user", password "pencil".
const RFC_PASSWORD: &str = "pencil";
const RFC_SALT_B64: &str = "W22ZaJ0SNY7soEsUEjb6gQ==";
const RFC_CLIENT_NONCE: &str = "rOprNGfwEbeRWgbNEkqO";
const RFC_SERVER_NONCE: &str = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
const RFC_C1: &str = "n,,n=user,r=rOprNGfwEbeRWgbNEkqO";
const RFC_S1: &str =
    "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
const RFC_C2: &str = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
const RFC_S2: &str = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=";

/// pg_authid.rolpassword from PostgreSQL 15 (`password_encryption = 'scram-sha-256'`).
/// (role, password, stored verifier)
const PG_VERIFIERS: &[(&str, &str, &str)] = &[
    (
        "scramuser",
        "scrampass",
        "SCRAM-SHA-256$4096:W4ZlSxRMG75ZvaU2hbWN9Q==$3PbdjiGtSNh1OuMkcfOx8OyR015fbGusPXJE8KCta28=:JKw53oJ8MPNQPjE4YLq9NBB+dDMRktRHsBDbQCUraT4=",
    ),
    // U+00AD SOFT HYPHEN: SASLprep maps it to nothing.
    (
        "s2",
        "I\u{00AD}X",
        "SCRAM-SHA-256$4096:clIYGxc350cSs4zbeFQufA==$n7wYsGA2Gze5bH1LlNfsoV4dnKt2TI5bth0O9Dp6U+M=:jwGKWrKa65s4wQ+cOIB85y8QL2nV9Vb+n9GriPU4E08=",
    ),
    // BEL is prohibited by SASLprep: PostgreSQL falls back to the raw password.
    (
        "s3",
        "a\u{0007}b",
        "SCRAM-SHA-256$4096:eWxkD81lY1p1mnNhDXfcoQ==$DD/qNv4JzFJ0AyWVMFy2n79mzt7oCG0LY7pgzblkLxU=:Nh2iRVXm8FHde39V5UWBZ7HyRF8gRFhVgZgT5iTYUVI=",
    ),
    // U+2168 ROMAN NUMERAL NINE: NFKC gives "IX".
    (
        "s4",
        "\u{2168}",
        "SCRAM-SHA-256$4096:eQ5GJ+vUqMRdppRZ7CD5CQ==$5uu/I5XE+4qHLLO1j+QeC/1PIZTokn6syndef9+zbZo=:QcVH+/3BYxQZZxbnnddjT0WcuGpAR6gybhxUYeD5VSA=",
    ),
];

fn rfc_verifier() -> ScramVerifier {
    let salt = B64.decode(RFC_SALT_B64).expect("salt");
    verifier_from_password(RFC_PASSWORD, &salt, 4096)
}

/// Parse a pg_authid verifier (test-only; the real parser lives in config::auth_file).
fn parse_pg(s: &str) -> ScramVerifier {
    let rest = s.strip_prefix("SCRAM-SHA-256$").expect("prefix");
    let (iter_salt, keys) = rest.split_once('$').expect("$");
    let (iter, salt) = iter_salt.split_once(':').expect(":");
    let (stored, server) = keys.split_once(':').expect(":");
    ScramVerifier {
        iterations: iter.parse().expect("iter"),
        salt: B64.decode(salt).expect("salt"),
        stored_key: decode_key(stored, "stored").expect("stored"),
        server_key: decode_key(server, "server").expect("server"),
        macs: Default::default(),
    }
}

fn small_verifier(password: &str) -> ScramVerifier {
    // Few iterations keep debug-build tests fast; the exchange does not depend on the count.
    verifier_from_password(password, b"0123456789abcdef", 16)
}

/// Drive a full exchange; returns the server (for client_key) and the client's final result.
fn exchange(
    verifier: &ScramVerifier,
    cred: ClientCredential,
) -> (ScramServer, Result<(), ScramError>) {
    let mut server = ScramServer::new(verifier.clone());
    let mut client = ScramClient::new(cred);
    let c1 = client.client_first();
    let s1 = server.client_first(&c1).expect("client-first");
    let c2 = client.server_first(&s1).expect("server-first");
    let result = server
        .client_final(&c2)
        .and_then(|s2| client.server_final(&s2));
    (server, result)
}

#[test]
fn rfc7677_vector_server_side() {
    let v = rfc_verifier();
    let mut server = ScramServer::with_nonce(v.clone(), RFC_SERVER_NONCE);
    assert_eq!(
        server.client_first(RFC_C1.as_bytes()).unwrap(),
        RFC_S1.as_bytes()
    );
    assert_eq!(server.client_key(), None);
    assert_eq!(
        server.client_final(RFC_C2.as_bytes()).unwrap(),
        RFC_S2.as_bytes()
    );
    let ck = server.client_key().expect("client key after success");
    assert_eq!(sha256(&ck), v.stored_key);
    let (expected_ck, _) = keys_from_password(RFC_PASSWORD, &v.salt, 4096);
    assert_eq!(ck, expected_ck);
}

#[test]
fn rfc7677_vector_client_side_password() {
    let mut client = ScramClient::with_nonce(
        ClientCredential::Password(RFC_PASSWORD.into()),
        "user",
        RFC_CLIENT_NONCE,
    );
    assert_eq!(client.client_first(), RFC_C1.as_bytes());
    assert_eq!(
        client.server_first(RFC_S1.as_bytes()).unwrap(),
        RFC_C2.as_bytes()
    );
    client.server_final(RFC_S2.as_bytes()).unwrap();
    assert!(client.is_done());
}

#[test]
fn rfc7677_vector_client_side_keys() {
    let salt = B64.decode(RFC_SALT_B64).unwrap();
    let (client_key, server_key) = keys_from_password(RFC_PASSWORD, &salt, 4096);
    let mut client = ScramClient::with_nonce(
        ClientCredential::Keys {
            client_key,
            server_key,
        },
        "user",
        RFC_CLIENT_NONCE,
    );
    client.client_first();
    assert_eq!(
        client.server_first(RFC_S1.as_bytes()).unwrap(),
        RFC_C2.as_bytes()
    );
    client.server_final(RFC_S2.as_bytes()).unwrap();
}

#[test]
fn verifiers_match_postgresql() {
    for (role, password, stored) in PG_VERIFIERS {
        let pg = parse_pg(stored);
        let ours = verifier_from_password(password, &pg.salt, pg.iterations);
        assert_eq!(ours, pg, "role {role}");
        assert_eq!(verifier_to_string(&ours), *stored, "role {role}");
    }
}

#[test]
fn client_with_keys_or_password_logs_in_to_a_postgresql_verifier() {
    let (_, password, stored) = PG_VERIFIERS[0];
    let pg = parse_pg(stored);
    // A client of ours logs in with the password; the recovered keys then log in again.
    let (server, r) = exchange(&pg, ClientCredential::Password(password.into()));
    r.unwrap();
    let keys = server.client_credential().expect("keys");
    let (_, r) = exchange(&pg, keys);
    r.unwrap();
}

#[test]
fn round_trip_with_password() {
    let v = small_verifier("secret");
    let (server, r) = exchange(&v, ClientCredential::Password("secret".into()));
    r.unwrap();
    let (ck, sk) = keys_from_password("secret", &v.salt, v.iterations);
    assert_eq!(server.client_key(), Some(ck));
    assert_eq!(sk, v.server_key);
}

#[test]
fn round_trip_with_keys() {
    let v = small_verifier("secret");
    let (client_key, server_key) = keys_from_password("secret", &v.salt, v.iterations);
    let (server, r) = exchange(
        &v,
        ClientCredential::Keys {
            client_key,
            server_key,
        },
    );
    r.unwrap();
    assert_eq!(server.client_key(), Some(client_key));
}

#[test]
fn round_trip_with_precomputed_keys_and_params() {
    let v = small_verifier("secret");
    let mut server = ScramServer::new(v.clone());
    // The credential is ignored when keys are supplied.
    let mut client = ScramClient::new(ClientCredential::Password("wrong".into()));
    let s1 = server.client_first(&client.client_first()).unwrap();
    let (salt, iterations) = server_first_params(&s1).unwrap();
    assert_eq!(
        (salt.as_slice(), iterations),
        (v.salt.as_slice(), v.iterations)
    );
    let (ck, sk) = keys_from_password("secret", &salt, iterations);
    let c2 = client.server_first_with_keys(&s1, ck, sk).unwrap();
    let s2 = server.client_final(&c2).unwrap();
    client.server_final(&s2).unwrap();
}

#[test]
fn wrong_password_is_bad_proof() {
    let v = small_verifier("secret");
    let (server, r) = exchange(&v, ClientCredential::Password("Secret".into()));
    assert!(matches!(r, Err(ScramError::BadProof)), "{r:?}");
    assert_eq!(server.client_key(), None);
    assert!(server.client_credential().is_none());
}

#[test]
fn wrong_server_key_is_bad_server_signature() {
    let v = small_verifier("secret");
    let (client_key, mut server_key) = keys_from_password("secret", &v.salt, v.iterations);
    server_key[0] ^= 1;
    let (_, r) = exchange(
        &v,
        ClientCredential::Keys {
            client_key,
            server_key,
        },
    );
    assert!(matches!(r, Err(ScramError::BadServerSignature)), "{r:?}");
}

#[test]
fn client_first_defaults_match_libpq() {
    let mut client = ScramClient::new(ClientCredential::Password("x".into()));
    let c1 = String::from_utf8(client.client_first()).unwrap();
    let nonce = c1.strip_prefix("n,,n=,r=").expect("libpq shape");
    assert_eq!(nonce.len(), 24);
    assert!(is_printable(nonce));
    // Two clients never share a nonce.
    let c1b = ScramClient::new(ClientCredential::Password("x".into())).client_first();
    assert_ne!(c1.as_bytes(), c1b.as_slice());
}

#[test]
fn server_nonce_is_random_and_extends_client_nonce() {
    let v = small_verifier("x");
    let s1 = ScramServer::new(v.clone())
        .client_first(b"n,,n=,r=abc")
        .unwrap();
    let s1b = ScramServer::new(v).client_first(b"n,,n=,r=abc").unwrap();
    assert_ne!(s1, s1b);
    let s1 = String::from_utf8(s1).unwrap();
    let nonce = s1.strip_prefix("r=abc").unwrap().split(',').next().unwrap();
    assert_eq!(nonce.len(), 24);
    assert!(s1.ends_with(",s=MDEyMzQ1Njc4OWFiY2RlZg==,i=16"), "{s1}");
}

#[test]
fn gs2_header_y_is_accepted_and_bound() {
    let v = small_verifier("secret");
    let (ck, _) = keys_from_password("secret", &v.salt, v.iterations);
    let client_final = |server: &mut ScramServer, s1: &[u8], cbind: &str| {
        let s1 = std::str::from_utf8(s1).unwrap();
        let nonce = &s1[2..s1.find(',').unwrap()];
        let without_proof = format!("c={cbind},r={nonce}");
        let auth = format!("n=,r=cn,{s1},{without_proof}");
        let proof = xor32(&ck, &hmac(&sha256(&ck), auth.as_bytes()));
        server.client_final(format!("{without_proof},p={}", B64.encode(proof)).as_bytes())
    };
    // "y,," → c=eSws
    let mut server = ScramServer::new(v.clone());
    let s1 = server.client_first(b"y,,n=,r=cn").unwrap();
    let s2 = client_final(&mut server, &s1, "eSws").unwrap();
    let auth_sig = String::from_utf8(s2).unwrap();
    assert!(auth_sig.starts_with("v="));
    // "y,," but c=biws ("n,,") → mismatch.
    let mut server = ScramServer::new(v);
    let s1 = server.client_first(b"y,,n=,r=cn").unwrap();
    assert!(matches!(
        client_final(&mut server, &s1, "biws"),
        Err(ScramError::Malformed(_))
    ));
}

#[test]
fn client_first_malformed_is_error() {
    let v = small_verifier("x");
    let long = format!("n,,n=,r={}", "a".repeat(MAX_SCRAM_MESSAGE_LEN));
    let cases: Vec<&[u8]> = vec![
        b"",
        b"n",
        b"n,",
        b"n,,",
        b"x,,n=,r=abc",
        b"p=tls-server-end-point,,n=,r=abc",
        b"n,a=admin,n=,r=abc",
        b"n,,m=ext,n=,r=abc",
        b"n,,r=abc",
        b"n,,n=",
        b"n,,n=,",
        b"n,,n=,r=",
        b"n,,n=,x=abc",
        b"n,,n=,r=ab c",
        b"n,,n=,r=\xff\xfe",
        b"\xff,,n=,r=abc",
        long.as_bytes(),
    ];
    for c in cases {
        let mut server = ScramServer::new(v.clone());
        let r = server.client_first(c);
        assert!(
            matches!(r, Err(ScramError::Malformed(_))),
            "{:?} → {r:?}",
            String::from_utf8_lossy(c)
        );
        // A failed exchange stays failed.
        assert!(server.client_final(b"c=biws,r=abc,p=AAAA").is_err());
        assert_eq!(server.client_key(), None);
    }
}

#[test]
fn iteration_counts_of_up_to_ten_digits_are_read() {
    // Leading zeros: 10 digits are read, 11 are refused whatever their value.
    assert_eq!(
        server_first_params(b"r=abc,s=QUJD,i=0000004096").unwrap(),
        (b"ABC".to_vec(), 4096)
    );
    assert!(matches!(
        server_first_params(b"r=abc,s=QUJD,i=00000004096"),
        Err(ScramError::Malformed("bad iteration count"))
    ));
    assert_eq!(
        server_first_params(b"r=abc,s=QUJD,i=1").unwrap(),
        (b"ABC".to_vec(), 1)
    );
}

#[test]
fn channel_binding_is_refused_by_name() {
    let v = small_verifier("x");
    assert!(matches!(
        ScramServer::new(v.clone()).client_first(b"p=tls-server-end-point,,n=,r=abc"),
        Err(ScramError::Malformed(
            "channel binding is not supported (SCRAM-SHA-256-PLUS not chosen)"
        ))
    ));
    assert!(matches!(
        ScramServer::new(v).client_first(b"x,,n=,r=abc"),
        Err(ScramError::Malformed("bad gs2 channel binding flag"))
    ));
}

/// A whole exchange with SCRAM-SHA-256-PLUS: the client binds to `client_cb`, the server
/// checks against `server_cb`.
fn plus_exchange(client_cb: &[u8], server_cb: &[u8]) -> Result<(), ScramError> {
    let v = small_verifier("pw");
    let mut server = ScramServer::new(v).with_channel_binding(Some(server_cb.to_vec()));
    assert_eq!(server.mechanisms(), &[MECHANISM_PLUS, MECHANISM]);
    let mut client = ScramClient::new(ClientCredential::Password("pw".into()))
        .with_channel_binding(ChannelBinding::EndPoint(client_cb.to_vec()));
    assert_eq!(client.mechanism(), MECHANISM_PLUS);
    server.select(client.mechanism())?;
    let first = client.client_first();
    assert!(first.starts_with(b"p=tls-server-end-point,,n=,r="));
    let sf = server.client_first(&first)?;
    let cf = client.server_first(&sf)?;
    let fin = server.client_final(&cf)?;
    client.server_final(&fin)
}

#[test]
fn channel_binding_plus_round_trip() {
    plus_exchange(b"cert hash", b"cert hash").unwrap();
}

#[test]
fn channel_binding_to_another_certificate_fails() {
    // A man in the middle terminates TLS with its own certificate: the hashes differ.
    assert!(matches!(
        plus_exchange(b"mitm cert hash", b"cert hash"),
        Err(ScramError::Malformed(
            "channel binding does not match gs2 header"
        ))
    ));
}

#[test]
fn channel_binding_downgrade_is_refused() {
    let v = small_verifier("pw");
    // The client could bind but thinks we cannot ("y"), while we offered -PLUS.
    let mut server = ScramServer::new(v.clone()).with_channel_binding(Some(b"h".to_vec()));
    server.select(MECHANISM).unwrap();
    assert!(matches!(
        server.client_first(b"y,,n=,r=abc"),
        Err(ScramError::Malformed(
            "SCRAM channel binding negotiation error"
        ))
    ));
    // -PLUS chosen with "n": refused; -PLUS without TLS: not advertised, not selectable.
    let mut server = ScramServer::new(v.clone()).with_channel_binding(Some(b"h".to_vec()));
    server.select(MECHANISM_PLUS).unwrap();
    assert!(server.client_first(b"n,,n=,r=abc").is_err());
    let mut server = ScramServer::new(v.clone()).with_channel_binding(Some(b"h".to_vec()));
    server.select(MECHANISM_PLUS).unwrap();
    assert!(server.client_first(b"p=tls-unique,,n=,r=abc").is_err());
    assert!(ScramServer::new(v).select(MECHANISM_PLUS).is_err());
}

#[test]
fn channel_binding_y_from_our_client_side() {
    // Over TLS with a server offering no -PLUS: "y", and c= binds the "y,," header.
    let v = small_verifier("pw");
    let mut server = ScramServer::new(v);
    let mut client = ScramClient::new(ClientCredential::Password("pw".into()))
        .with_channel_binding(ChannelBinding::NotOffered);
    server.select(client.mechanism()).unwrap();
    let first = client.client_first();
    assert!(first.starts_with(b"y,,"));
    let sf = server.client_first(&first).unwrap();
    let cf = client.server_first(&sf).unwrap();
    assert!(cf.starts_with(b"c=eSws,"), "base64 of y,,");
    let fin = server.client_final(&cf).unwrap();
    client.server_final(&fin).unwrap();
}

#[test]
fn credential_debug_names_the_kind() {
    assert_eq!(
        format!("{:?}", ClientCredential::Password("pw".into())),
        "Password(..)"
    );
    let keys = ClientCredential::Keys {
        client_key: [7; 32],
        server_key: [7; 32],
    };
    assert_eq!(format!("{keys:?}"), "Keys{..}");
}

#[test]
fn a_message_of_exactly_the_limit_is_read() {
    let v = small_verifier("x");
    let head = "n,,n=,r=";
    let at_limit = format!("{head}{}", "a".repeat(MAX_SCRAM_MESSAGE_LEN - head.len()));
    assert_eq!(at_limit.len(), MAX_SCRAM_MESSAGE_LEN);
    assert!(
        ScramServer::new(v.clone())
            .client_first(at_limit.as_bytes())
            .is_ok()
    );
    let over = format!("{at_limit}a");
    assert!(matches!(
        ScramServer::new(v).client_first(over.as_bytes()),
        Err(ScramError::Malformed("message too long"))
    ));
}

#[test]
fn client_first_accepts_extensions_and_a_user_name() {
    let v = small_verifier("x");
    ScramServer::new(v.clone())
        .client_first(b"n,,n=bob,r=abc,x=ext")
        .unwrap();
    ScramServer::new(v).client_first(b"y,,n=,r=abc").unwrap();
}

#[test]
fn client_final_malformed_is_error() {
    let v = small_verifier("x");
    let good_proof = B64.encode([0u8; 32]);
    let cases: Vec<(String, &str)> = vec![
        (String::new(), "malformed"),
        ("c=biws".into(), "malformed"),
        ("c=biws,r=NONCE".into(), "malformed"),
        ("c=biws,r=NONCE,p=".into(), "malformed"),
        ("c=biws,r=NONCE,p=!!!!".into(), "malformed"),
        ("c=biws,r=NONCE,p=AAAA".into(), "malformed"),
        (format!("c=biws,r=NONCE,p={good_proof}AA"), "malformed"),
        (format!("c=biws,r=NONCE,p={good_proof},x=1"), "malformed"),
        (format!("c=!!,r=NONCE,p={good_proof}"), "malformed"),
        (format!("c=eSws,r=NONCE,p={good_proof}"), "malformed"),
        (format!("r=NONCE,p={good_proof}"), "malformed"),
        (format!("c=biws,p={good_proof}"), "malformed"),
        (format!("c=biws,r=NONCEx,p={good_proof}"), "nonce"),
        (format!("c=biws,r=cn,p={good_proof}"), "nonce"),
        (format!("c=biws,r=NONCE,p={good_proof}"), "proof"),
        (format!("c=biws,r=NONCE,x=ext,p={good_proof}"), "proof"),
        (
            format!("c=biws,r=NONCE,p={}", "A".repeat(MAX_SCRAM_MESSAGE_LEN)),
            "malformed",
        ),
    ];
    for (c, want) in cases {
        let mut server = ScramServer::new(v.clone());
        let s1 = String::from_utf8(server.client_first(b"n,,n=,r=cn").unwrap()).unwrap();
        let nonce = &s1[2..s1.find(',').unwrap()];
        let c = c.replace("NONCE", nonce);
        let r = server.client_final(c.as_bytes());
        let ok = match want {
            "malformed" => matches!(r, Err(ScramError::Malformed(_))),
            "nonce" => matches!(r, Err(ScramError::Nonce)),
            _ => matches!(r, Err(ScramError::BadProof)),
        };
        assert!(ok, "{c:?} → {r:?}, want {want}");
        assert_eq!(server.client_key(), None);
        // No second try on the same exchange.
        assert!(server.client_final(c.as_bytes()).is_err());
    }
}

#[test]
fn messages_out_of_order_are_errors() {
    let v = small_verifier("x");
    let mut server = ScramServer::new(v.clone());
    assert!(server.client_final(b"c=biws,r=a,p=AAAA").is_err());
    let mut server = ScramServer::new(v);
    server.client_first(b"n,,n=,r=abc").unwrap();
    assert!(server.client_first(b"n,,n=,r=abc").is_err());

    let mut client = ScramClient::new(ClientCredential::Password("x".into()));
    assert!(client.server_first(b"r=abcdef,s=AAAA,i=1").is_err());
    assert!(client.server_final(b"v=AAAA").is_err());
    assert!(!client.is_done());
}

#[test]
fn server_first_malformed_is_error() {
    let salt = "MDEyMzQ1Njc4OWFiY2RlZg==";
    let cases: Vec<(String, &str)> = vec![
        (String::new(), "malformed"),
        ("r=".into(), "malformed"),
        ("r=cnSN".into(), "malformed"),
        ("r=cnSN,".into(), "malformed"),
        ("r=cnSN,s=".into(), "malformed"),
        (format!("r=cnSN,s={salt}"), "malformed"),
        (format!("r=cnSN,s={salt},i="), "malformed"),
        (format!("r=cnSN,s={salt},i=0"), "malformed"),
        (format!("r=cnSN,s={salt},i=-1"), "malformed"),
        (format!("r=cnSN,s={salt},i=+5"), "malformed"),
        (format!("r=cnSN,s={salt},i=4096x"), "malformed"),
        (format!("r=cnSN,s={salt},i=1000001"), "malformed"),
        (format!("r=cnSN,s={salt},i=4294967295"), "malformed"),
        (format!("r=cnSN,s={salt},i=4294967296"), "malformed"),
        (
            format!("r=cnSN,s={salt},i=99999999999999999999999"),
            "malformed",
        ),
        ("r=cnSN,s=!!!,i=1".into(), "malformed"),
        ("r=cnSN,i=1,s=AAAA".into(), "malformed"),
        ("m=x,r=cnSN,s=AAAA,i=1".into(), "malformed"),
        ("r=cn SN,s=AAAA,i=1".into(), "malformed"),
        ("s=AAAA,r=cnSN,i=1".into(), "malformed"),
        (
            format!("r=cnSN,s={}", "A".repeat(MAX_SCRAM_MESSAGE_LEN)),
            "malformed",
        ),
        ("r=SNcn,s=AAAA,i=1".into(), "nonce"),
        ("r=cn,s=AAAA,i=1".into(), "nonce"),
        ("r=c,s=AAAA,i=1".into(), "nonce"),
    ];
    for (s, want) in cases {
        let mut client = ScramClient::with_nonce(ClientCredential::Password("x".into()), "", "cn");
        client.client_first();
        let r = client.server_first(s.as_bytes());
        let ok = match want {
            "malformed" => matches!(r, Err(ScramError::Malformed(_))),
            _ => matches!(r, Err(ScramError::Nonce)),
        };
        assert!(ok, "{s:?} → {r:?}, want {want}");
        assert!(server_first_params(s.as_bytes()).is_err() || want == "nonce");
        assert!(client.server_final(b"v=AAAA").is_err());
    }
    // The bound itself is accepted by the parser (not run: a million PBKDF2 rounds).
    let at_cap = format!("r=cnSN,s={salt},i={MAX_ITERATIONS}");
    assert_eq!(
        server_first_params(at_cap.as_bytes()).unwrap().1,
        MAX_ITERATIONS
    );
    // Extensions after i= are allowed.
    let ext = format!("r=cnSN,s={salt},i=1,x=y");
    assert_eq!(server_first_params(ext.as_bytes()).unwrap().1, 1);
}

#[test]
fn server_final_malformed_is_error() {
    let v = small_verifier("secret");
    let good = B64.encode([0u8; 32]);
    let cases: Vec<String> = vec![
        String::new(),
        "v=".into(),
        "v=!!!".into(),
        "v=AAAA".into(),
        format!("x={good}"),
        "e=invalid-proof".into(),
        format!("v={good}AA"),
        format!("v={}", "A".repeat(MAX_SCRAM_MESSAGE_LEN)),
    ];
    for s in cases {
        let mut server = ScramServer::new(v.clone());
        let mut client = ScramClient::new(ClientCredential::Password("secret".into()));
        let s1 = server.client_first(&client.client_first()).unwrap();
        client.server_first(&s1).unwrap();
        let r = client.server_final(s.as_bytes());
        assert!(matches!(r, Err(ScramError::Malformed(_))), "{s:?} → {r:?}");
        assert!(!client.is_done());
    }
    // A well-formed but wrong signature.
    let mut server = ScramServer::new(v);
    let mut client = ScramClient::new(ClientCredential::Password("secret".into()));
    let s1 = server.client_first(&client.client_first()).unwrap();
    client.server_first(&s1).unwrap();
    let r = client.server_final(format!("v={good}").as_bytes());
    assert!(matches!(r, Err(ScramError::BadServerSignature)), "{r:?}");
}

#[test]
fn truncated_and_garbage_messages_never_panic() {
    let v = rfc_verifier();
    // Every prefix of a valid client-final-message fails.
    for i in 0..RFC_C2.len() {
        let mut server = ScramServer::with_nonce(v.clone(), RFC_SERVER_NONCE);
        server.client_first(RFC_C1.as_bytes()).unwrap();
        assert!(
            server.client_final(&RFC_C2.as_bytes()[..i]).is_err(),
            "prefix {i}"
        );
    }
    // Prefixes of the other messages: errors or not, no panics.
    for i in 0..RFC_C1.len() {
        let _ = ScramServer::new(v.clone()).client_first(&RFC_C1.as_bytes()[..i]);
    }
    for i in 0..RFC_S1.len() {
        let mut client = ScramClient::with_nonce(
            ClientCredential::Keys {
                client_key: [0; 32],
                server_key: [0; 32],
            },
            "user",
            RFC_CLIENT_NONCE,
        );
        client.client_first();
        let r = client.server_first(&RFC_S1.as_bytes()[..i]);
        // "…,i=4", "…,i=40", "…,i=409" are complete messages in their own right.
        let complete = i >= RFC_S1.find(",i=").unwrap() + 4;
        assert!(complete || r.is_err(), "prefix {i}");
    }
    // Pseudo-random bytes drawn from the SCRAM alphabet.
    let alphabet = b"nyp=,rsicvea+/AZz09\xff\x00";
    let mut x: u32 = 0x1234_5678;
    for _ in 0..2000 {
        let len = (x % 64) as usize;
        let mut msg = Vec::with_capacity(len);
        for _ in 0..len {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            msg.push(alphabet[(x as usize) % alphabet.len()]);
        }
        let mut server = ScramServer::new(v.clone());
        let _ = server.client_first(&msg);
        let _ = server.client_final(&msg);
        let _ = server_first_params(&msg);
        let mut client = ScramClient::new(ClientCredential::Keys {
            client_key: [0; 32],
            server_key: [0; 32],
        });
        client.client_first();
        let _ = client.server_first(&msg);
        let _ = client.server_final(&msg);
    }
}

#[test]
fn credential_debug_hides_secrets() {
    let p = format!("{:?}", ClientCredential::Password("hunter2".into()));
    assert!(!p.contains("hunter2"));
    let k = format!(
        "{:?}",
        ClientCredential::Keys {
            client_key: [7; 32],
            server_key: [7; 32]
        }
    );
    assert!(!k.contains('7'));
}

#[test]
fn pass_through_takes_any_salt_length_and_iteration_count() {
    // A verifier as a server could store it (keys made here without PBKDF2: any ClientKey
    // has a verifier), with salts of 1 and 64 bytes and counts past the PBKDF2 bound.
    for (salt, iterations) in [
        (vec![7u8], 1u32),
        (vec![1u8; 64], 4096),
        (vec![9u8; 16], MAX_ITERATIONS + 1),
        (vec![3u8; 33], u32::MAX),
    ] {
        let client_key = [0x5a; 32];
        let server_key = [0xa5; 32];
        let verifier = ScramVerifier {
            iterations,
            salt: salt.clone(),
            stored_key: sha256(&client_key),
            server_key,
            macs: Default::default(),
        };
        // A client proving ClientKey: the pooler's server side recovers it…
        let (server, r) = exchange(
            &verifier,
            ClientCredential::Keys {
                client_key,
                server_key,
            },
        );
        r.unwrap_or_else(|e| panic!("salt {} i={iterations}: {e}", salt.len()));
        let learned = server.client_credential().expect("keys learned");
        // …and logs in with it to a server holding the same verifier.
        let (_, r) = exchange(&verifier, learned);
        r.unwrap_or_else(|e| panic!("pass-through salt {} i={iterations}: {e}", salt.len()));
    }
    // Deriving from a password past the bound is refused (no unbounded PBKDF2).
    let mut client = ScramClient::with_nonce(ClientCredential::Password("x".into()), "", "cn");
    client.client_first();
    let s1 = format!("r=cnSN,s=AAAA,i={}", MAX_ITERATIONS + 1);
    assert!(matches!(
        client.server_first(s1.as_bytes()),
        Err(ScramError::Malformed(_))
    ));
}
