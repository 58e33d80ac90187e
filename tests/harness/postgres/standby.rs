//! A standby's data directory without `pg_basebackup`, for a server newer than every
//! installed one (Debian's 15 refuses 16 and newer): PostgreSQL's low-level backup
//! (`pg_backup_start` … `pg_backup_stop`; 14: `pg_start_backup` … `pg_stop_backup`) around
//! a file copy, leaving out what pg_basebackup leaves out. The standby streams its WAL from
//! a physical slot made before the backup started, so the primary keeps every segment the
//! copy needs.
use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use super::super::{pg_bin, server_major};
use super::{RunAs, TempPostgres};

/// Top-level entries of a data directory not copied (as pg_basebackup leaves them out).
const SKIPPED: [&str; 5] = [
    "postmaster.pid",
    "postmaster.opts",
    "backup_label",
    "standby.signal",
    "harness.conf",
];

/// Top-level folders copied empty (their contents belong to the running primary).
const EMPTIED: [&str; 8] = [
    "pg_wal",
    "pg_replslot",
    "pg_stat_tmp",
    "pg_dynshmem",
    "pg_notify",
    "pg_serial",
    "pg_snapshots",
    "pg_subtrans",
];

/// The printed line psql echoes once the backup has started.
const STARTED: &str = "harness: backup started";

/// Make `data` a standby of `primary`: `standby.signal`, its `primary_conninfo` and a slot
/// of its own on the primary.
pub(super) fn make(primary: &TempPostgres, run_as: RunAs, data: &Path) {
    static SLOTS: AtomicU32 = AtomicU32::new(0);
    let slot = format!(
        "harness_standby_{}_{}",
        std::process::id(),
        SLOTS.fetch_add(1, Ordering::Relaxed)
    );
    let (start, stop) = if server_major() >= 15 {
        (
            "pg_backup_start('harness standby', true)",
            "pg_backup_stop(false)",
        )
    } else {
        (
            "pg_start_backup('harness standby', true, false)",
            "pg_stop_backup(false)",
        )
    };
    let mut psql = Command::new(pg_bin("psql"))
        .args(["-X", "-At", "-v", "ON_ERROR_STOP=1", "-d"])
        .arg(primary.dsn("postgres", "postgres"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run psql for a low-level backup");
    let mut input = psql.stdin.take().expect("psql stdin");
    let mut output = BufReader::new(psql.stdout.take().expect("psql stdout"));
    writeln!(
        input,
        "SELECT pg_catalog.pg_create_physical_replication_slot('{slot}', true);\n\
         SELECT pg_catalog.{start};\n\\echo {STARTED}"
    )
    .and_then(|()| input.flush())
    .expect("write to psql");
    let mut line = String::new();
    while line.trim_end() != STARTED {
        line.clear();
        if output.read_line(&mut line).expect("read psql") == 0 {
            failed(psql, "start a backup");
        }
    }
    copy_dir(run_as, &primary.data_dir(), data, true)
        .unwrap_or_else(|e| panic!("copy the primary's data for a standby: {e}"));
    writeln!(input, "SELECT labelfile FROM pg_catalog.{stop};").expect("write to psql");
    drop(input);
    let mut label = String::new();
    output.read_to_string(&mut label).expect("read psql");
    let status = psql.wait().expect("wait for psql");
    if !status.success() || label.is_empty() {
        failed(psql, "stop the backup");
    }
    // psql ends the (already newline-ended) label with a newline of its own.
    label.pop();
    run_as.write(&data.join("backup_label"), &label);
    run_as.write(&data.join("standby.signal"), "");
    let auto = data.join("postgresql.auto.conf");
    let mut conf = fs::read_to_string(&auto).unwrap_or_default();
    conf.push_str(&format!(
        "primary_conninfo = 'host=127.0.0.1 port={} user=postgres'\nprimary_slot_name = '{slot}'\n",
        primary.port()
    ));
    run_as.write(&auto, &conf);
}

/// Panic with what psql said.
fn failed(mut psql: Child, what: &str) -> ! {
    let _ = psql.wait();
    let mut err = String::new();
    if let Some(mut stderr) = psql.stderr.take() {
        let _ = stderr.read_to_string(&mut err);
    }
    panic!("psql could not {what} on the primary: {err}");
}

/// Copy the folder `from` to `to` (made here, mode 0700, owned by `run_as`); at the top
/// level without `SKIPPED` and with `EMPTIED` folders empty. A file the running server
/// removed while it was copied is left out (the WAL replayed from the backup's start
/// accounts for it).
fn copy_dir(run_as: RunAs, from: &Path, to: &Path, top: bool) -> io::Result<()> {
    fs::create_dir(to)?;
    fs::set_permissions(to, fs::Permissions::from_mode(0o700))?;
    run_as.own(to);
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        let name = entry.file_name();
        let name_str = name.to_string_lossy();
        if top && SKIPPED.contains(&name_str.as_ref()) {
            continue;
        }
        let target = to.join(&name);
        let kind = match entry.file_type() {
            Ok(kind) => kind,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let copied = if kind.is_dir() && top && EMPTIED.contains(&name_str.as_ref()) {
            fs::create_dir(&target)
                .and_then(|()| fs::set_permissions(&target, fs::Permissions::from_mode(0o700)))
        } else if kind.is_dir() {
            copy_dir(run_as, &entry.path(), &target, false)
        } else {
            fs::copy(entry.path(), &target).map(drop)
        };
        match copied {
            Ok(()) => run_as.own(&target),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    if top {
        let status = to.join("pg_wal").join("archive_status");
        fs::create_dir_all(&status)?;
        run_as.own(&status);
    }
    Ok(())
}
