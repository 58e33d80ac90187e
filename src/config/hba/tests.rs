use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;

use super::*;

/// Parse `text` as `/etc/pgb/hba.conf`, with `@file`s served from `files`.
fn parse_with(text: &str, ident: Option<&Ident>, files: &[(&str, &str)]) -> Result<Hba, HbaError> {
    let files: HashMap<String, String> = files
        .iter()
        .map(|(p, t)| (p.to_string(), t.to_string()))
        .collect();
    Hba::parse(
        text,
        Path::new("/etc/pgb/hba.conf"),
        ident,
        &mut |p: &Path| {
            files
                .get(&p.display().to_string())
                .cloned()
                .ok_or_else(|| HbaError {
                    file: p.display().to_string(),
                    line: 0,
                    msg: "cannot read: No such file or directory".into(),
                })
        },
    )
}

fn parse(text: &str) -> Hba {
    parse_with(text, None, &[]).unwrap_or_else(|e| panic!("{e}"))
}

fn tcp(addr: &str) -> Origin {
    Origin::Tcp {
        addr: addr.parse::<IpAddr>().unwrap(),
        tls: false,
    }
}

fn tls(addr: &str) -> Origin {
    Origin::Tcp {
        addr: addr.parse::<IpAddr>().unwrap(),
        tls: true,
    }
}

/// The method of the rule met, "none" when no rule is.
fn method(hba: &Hba, origin: Origin, db: &str, user: &str) -> &'static str {
    hba.lookup(origin, false, db, user)
        .map_or("none", |r| r.method.as_str())
}

const RULES: &str = "\
# TYPE DATABASE USER ADDRESS METHOD
 \t \t
local   dbp     all                     peer
local   all     userp                   password
local   dbz     userz                   trust
local   dbs     users                   scram-sha-256
local   all     all                     md5

hostssl   all   all   10.0.0.0/8        cert
hostnossl all   all   11.0.0.0/8        md5
host      all   all   127.0.0.0  255.255.255.0   password
host      db1   all   0.0.0.0/0         md5
host      tmp1,all  user1,user2 , user3  16.0.0.0/8  md5
host      d1,d2,d3  t18user  18.0.0.0/8  trust # comment
host      \"q1\"\"q2\"  \"a , b\"  19.0.0.0/8  cert
host      \"all\"  \"all\"  20.0.0.0/8  cert
host      mdb   muser   199.199.199.199/32  cert
host      mdb2  muser   128.0.0.0/9    trust
host      mdb2  muser   128.0.0.0/8    md5
host      mdb2  muser   128.0.0.0/1    cert
host      mdb   muser   ff11::0/16     md5
host      mdb   muser   ::1/128        trust
host      mdb3  muser   all            scram-sha-256
host      mdb4  muser   all            reject
host      replication  admin  ::1/128  trust
host      sameuser  all  30.0.0.0/8  trust
";

#[test]
fn local_rules_match_unix_sockets_only() {
    let h = parse(RULES);
    assert_eq!(method(&h, Origin::Unix, "dbp", "user"), "peer");
    assert_eq!(method(&h, Origin::Unix, "db", "userp"), "password");
    assert_eq!(method(&h, Origin::Unix, "dbz", "userz"), "trust");
    assert_eq!(method(&h, Origin::Unix, "dbs", "users"), "scram-sha-256");
    assert_eq!(method(&h, Origin::Unix, "db", "user"), "md5");
    // No host rule applies to a Unix socket, no local rule to TCP.
    assert_eq!(method(&h, tcp("1.2.3.4"), "dbp", "user"), "none");
}

#[test]
fn hostssl_and_hostnossl_follow_tls() {
    let h = parse(RULES);
    assert_eq!(method(&h, tls("10.1.1.1"), "db", "user"), "cert");
    assert_eq!(method(&h, tcp("10.1.1.1"), "db", "user"), "none");
    assert_eq!(method(&h, tcp("11.1.1.1"), "db", "user"), "md5");
    assert_eq!(method(&h, tls("11.1.1.1"), "db", "user"), "none");
    // host: both.
    assert_eq!(method(&h, tcp("127.0.0.3"), "db", "user"), "password");
    assert_eq!(method(&h, tls("127.0.0.2"), "db", "user"), "password");
    // The separate mask: 127.0.1.4 is outside 127.0.0.0/255.255.255.0.
    assert_eq!(method(&h, tcp("127.0.1.4"), "db", "user"), "none");
    assert_eq!(method(&h, tcp("127.0.1.4"), "db1", "user"), "md5");
}

#[test]
fn lists_of_names() {
    let h = parse(RULES);
    assert_eq!(method(&h, tcp("16.0.0.1"), "db2", "user1"), "md5");
    assert_eq!(method(&h, tcp("16.0.0.1"), "db2", "user3"), "md5");
    assert_eq!(method(&h, tcp("16.0.0.1"), "db2", "user4"), "none");
    assert_eq!(method(&h, tcp("18.0.0.2"), "d3", "t18user"), "trust");
    assert_eq!(method(&h, tcp("18.0.0.2"), "d4", "t18user"), "none");
    assert_eq!(method(&h, tcp("18.0.0.2"), "d1", "user"), "none");
}

#[test]
fn quoted_names_are_names_not_keywords() {
    let h = parse(RULES);
    assert_eq!(method(&h, tcp("19.0.0.2"), "q1\"q2", "a , b"), "cert");
    assert_eq!(method(&h, tcp("19.0.0.2"), "q1", "a"), "none");
    // "all" quoted is the database and user named all.
    assert_eq!(method(&h, tcp("20.0.0.2"), "all", "all"), "cert");
    assert_eq!(method(&h, tcp("20.0.0.2"), "db", "user"), "none");
}

#[test]
fn masks_and_ipv6() {
    let h = parse(RULES);
    assert_eq!(method(&h, tcp("199.199.199.199"), "mdb", "muser"), "cert");
    assert_eq!(method(&h, tcp("199.199.199.198"), "mdb", "muser"), "none");
    assert_eq!(method(&h, tcp("128.1.1.1"), "mdb2", "muser"), "trust");
    assert_eq!(method(&h, tcp("128.200.1.1"), "mdb2", "muser"), "md5");
    assert_eq!(method(&h, tcp("254.1.1.1"), "mdb2", "muser"), "cert");
    assert_eq!(method(&h, tcp("ff11:2::1"), "mdb", "muser"), "md5");
    assert_eq!(method(&h, tcp("ff22:3::1"), "mdb", "muser"), "none");
    assert_eq!(method(&h, tcp("::1"), "mdb", "muser"), "trust");
    // An IPv4 client on an IPv6 socket is matched as IPv4.
    assert_eq!(
        method(&h, tcp("::ffff:199.199.199.199"), "mdb", "muser"),
        "cert"
    );
    // An IPv4 rule never matches an IPv6 client, and the other way round.
    assert_eq!(method(&h, tcp("::c7c7:c7c7"), "mdb", "muser"), "none");
}

#[test]
fn address_all_and_reject() {
    let h = parse(RULES);
    assert_eq!(method(&h, tcp("1.1.1.1"), "mdb3", "muser"), "scram-sha-256");
    assert_eq!(method(&h, tcp("::2"), "mdb3", "muser"), "scram-sha-256");
    assert_eq!(method(&h, tcp("1.1.1.1"), "mdb4", "muser"), "reject");
}

#[test]
fn replication_connections_meet_only_replication_rules() {
    let h = parse(RULES);
    let r = h.lookup(tcp("::1"), true, "whatever", "admin").unwrap();
    assert_eq!((r.method, r.line), (Method::Trust, 25));
    // `all` does not cover physical replication, and `replication` is no database name.
    assert!(h.lookup(tcp("1.1.1.1"), true, "mdb3", "muser").is_none());
    assert!(
        h.lookup(tcp("::1"), false, "replication", "admin")
            .is_none()
    );
}

#[test]
fn sameuser_matches_the_database_named_as_the_user() {
    let h = parse(RULES);
    assert_eq!(method(&h, tcp("30.0.0.1"), "alice", "alice"), "trust");
    assert_eq!(method(&h, tcp("30.0.0.1"), "bob", "alice"), "none");
}

#[test]
fn at_files_are_read_relative_to_the_file_naming_them() {
    let files = [
        (
            "/etc/pgb/dbs.txt",
            "appdb, otherdb\n# comment\n\"quoted db\" @more/dbs2.txt\n",
        ),
        ("/etc/pgb/more/dbs2.txt", "nested\n"),
        ("/etc/pgb/users.txt", "alice bob\n"),
    ];
    let h = parse_with(
        "host @dbs.txt @users.txt all md5\nhost all @/etc/pgb/users.txt all trust\n",
        None,
        &files,
    )
    .unwrap();
    for db in ["appdb", "otherdb", "quoted db", "nested"] {
        assert_eq!(method(&h, tcp("1.1.1.1"), db, "bob"), "md5", "{db}");
    }
    assert_eq!(method(&h, tcp("1.1.1.1"), "x", "alice"), "trust");
    assert_eq!(method(&h, tcp("1.1.1.1"), "x", "carol"), "none");
    // A missing @file is an error at the line naming it.
    let e = parse_with("local @nope.txt all trust\n", None, &[]).unwrap_err();
    assert_eq!((e.file.as_str(), e.line), ("/etc/pgb/hba.conf", 1));
    assert!(e.msg.starts_with("@nope.txt: /etc/pgb/nope.txt"), "{e}");
    // An @file including itself stops at the depth limit.
    let e = parse_with(
        "local @loop.txt all trust\n",
        None,
        &[("/etc/pgb/loop.txt", "@loop.txt\n")],
    )
    .unwrap_err();
    assert!(e.msg.contains("nested too deep"), "{e}");
}

#[test]
fn map_options_name_ident_maps() {
    let ident = Ident::parse("m os pg\n", Path::new("ident.conf")).unwrap();
    let h = parse_with("local all all peer map=m\n", Some(&ident), &[]).unwrap();
    assert_eq!(h.rules[0].map.as_deref(), Some("m"));
    let e = parse_with("local all all peer map=other\n", Some(&ident), &[]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "/etc/pgb/hba.conf:1: ident map \"other\" is not found in auth_ident_file"
    );
    let e = parse_with("local all all peer map=m\n", None, &[]).unwrap_err();
    assert!(e.msg.contains("not found"), "{e}");
}

#[test]
fn bits_outside_the_mask_are_a_warning() {
    let h = parse("host all all 10.0.0.1/8 md5\nhost all all ::1/0 md5\n");
    assert_eq!(h.warnings.len(), 2, "{:?}", h.warnings);
    assert!(h.warnings[0].starts_with("/etc/pgb/hba.conf:1: address 10.0.0.1"));
    // Such a rule matches nobody (as in PgBouncer).
    assert_eq!(method(&h, tcp("10.0.0.1"), "db", "u"), "none");
}

#[test]
fn errors_name_file_and_line() {
    for (text, want) in [
        ("local all all\n", "1: missing an authentication method"),
        (
            "host all all 1.2.3.4/33 md5\n",
            "1: invalid mask length \"33\"",
        ),
        (
            "host all all ::1/129 md5\n",
            "1: invalid mask length \"129\"",
        ),
        ("host all all 1.2.3.4 md5\n", "1: invalid mask \"md5\""),
        (
            "host all all example.com md5\n",
            "1: invalid address \"example.com\"",
        ),
        (
            "host all all samenet md5\n",
            "1: address \"samenet\" is not supported",
        ),
        (
            "hostgssenc all all all md5\n",
            "1: record type \"hostgssenc\" is not supported",
        ),
        (
            "nohost all all all md5\n",
            "1: unknown record type \"nohost\"",
        ),
        (
            "local all all ldap ldapserver=x\n",
            "1: authentication method \"ldap\" is not supported",
        ),
        (
            "local all all pam\n",
            "1: authentication method \"pam\" is not supported",
        ),
        (
            "local all all md6\n",
            "1: unknown authentication method \"md6\"",
        ),
        (
            "local all all md5 clientcert=verify-full\n",
            "1: unsupported option \"clientcert=verify-full\"",
        ),
        (
            "local samerole all md5\n",
            "1: \"samerole\" is not supported",
        ),
        (
            "local all +admins md5\n",
            "1: group names (\"+admins\") are not supported",
        ),
        ("local all,,x all md5\n", "1: empty name in database field"),
        ("local \"all all md5\n", "1: unterminated quoted string"),
        (
            "\n\nlocal all all \"md5\"\n",
            "3: expected an authentication method",
        ),
        ("local all\n", "1: missing user field"),
        ("host all all\n", "1: missing an address"),
    ] {
        let e = parse_with(text, None, &[]).unwrap_err().to_string();
        let want = format!("/etc/pgb/hba.conf:{want}");
        assert!(e.starts_with(&want), "{text:?}: {e}");
    }
}

#[test]
fn blank_and_comment_lines_are_skipped() {
    let h = parse("\n   \n\t# only a comment\nlocal all all trust # trailing\n");
    assert_eq!(h.rules.len(), 1);
    assert_eq!(h.rules[0].line, 4);
}

#[test]
fn a_file_loads_from_disk_with_its_at_files() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("users"), "alice\n").unwrap();
    std::fs::write(d.path().join("hba.conf"), "local all @users trust\n").unwrap();
    let h = Hba::load(&d.path().join("hba.conf"), None).unwrap();
    assert_eq!(method(&h, Origin::Unix, "x", "alice"), "trust");
    let e = Hba::load(&d.path().join("none.conf"), None).unwrap_err();
    assert!(e.msg.starts_with("cannot read"), "{e}");
}
