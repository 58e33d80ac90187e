//! Writes pgcarpool(1) to stdout: the options come from the command line definition
//! (`pgcarpool::cli::Cli`), the rest (signals, files) is written here.
//! `cargo run --example manpage > target/man/pgcarpool.1`; scripts/package does this.
use clap::CommandFactory;
use roff::{Roff, bold, roman};

/// Signals, as in the README's "Running it".
const SIGNALS: &[(&str, &str)] = &[
    (
        "SIGHUP",
        "Reload the configuration file and auth_file; connected clients stay. Each changed \
         setting is logged; those that need a restart keep their old value.",
    ),
    (
        "SIGTERM",
        "Stop accepting, then shut down once every client has left (a second SIGTERM: at once).",
    ),
    (
        "SIGINT",
        "Safe shutdown: stop accepting, then shut down once every server connection is released.",
    ),
    ("SIGQUIT", "Shut down at once."),
    (
        "SIGUSR1",
        "Pause: wait for servers to be released, then hold new queries.",
    ),
    ("SIGUSR2", "Resume after a pause."),
];

/// Files of the Debian package.
const FILES: &[(&str, &str)] = &[
    (
        "/etc/pgcarpool/pgcarpool.ini",
        "The configuration (PgBouncer's pgbouncer.ini format).",
    ),
    (
        "/etc/pgcarpool/userlist.txt",
        "The auth_file: \"user\" \"secret\" lines.",
    ),
    (
        "/run/pgcarpool/",
        "The pidfile and the Unix socket (systemd's RuntimeDirectory).",
    ),
    ("/var/log/pgcarpool/pgcarpool.log", "The logfile."),
    (
        "/usr/share/doc/pgcarpool/",
        "README.md, settings.md (every setting), admin.md (the admin console), \
         compatibility.md (what a client can tell apart from a direct PostgreSQL session), \
         troubleshooting.md (every message, its cause and fix).",
    ),
];

fn main() -> std::io::Result<()> {
    let man = clap_mangen::Man::new(pgcarpool::cli::Cli::command());
    let out = &mut std::io::stdout().lock();
    man.render_title(out)?;
    man.render_name_section(out)?;
    man.render_synopsis_section(out)?;
    man.render_description_section(out)?;
    man.render_options_section(out)?;

    let mut extra = Roff::default();
    section(&mut extra, "SIGNALS", SIGNALS);
    section(&mut extra, "FILES", FILES);
    extra.control("SH", ["SEE ALSO"]);
    extra.text([
        bold("pgbouncer"),
        roman("(1), "),
        bold("pgbouncer"),
        roman("(5): the configuration format and admin console pgcarpool follows."),
    ]);
    extra.to_writer(out)?;
    man.render_version_section(out)
}

/// A section of tagged paragraphs: the term in bold, its meaning below it.
fn section(roff: &mut Roff, heading: &str, entries: &[(&str, &str)]) {
    roff.control("SH", [heading]);
    for (term, meaning) in entries {
        roff.control("TP", [])
            .text([bold(*term)])
            .text([roman(*meaning)]);
    }
}
