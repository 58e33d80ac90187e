//! Where the log goes, as PgBouncer: stderr (unless `-q` or `-d`), the `logfile` (reopened
//! on every reload, so `mv log log.1; kill -HUP` rotates it, and a new `logfile` applies
//! at once), and syslog (`syslog = 1`: the local socket, with `syslog_ident` and
//! `syslog_facility`). One subscriber for the whole process, installed by the binary;
//! in-process poolers (tests) leave it alone and `reopen` does nothing.
use std::fs::File;
use std::io::Write;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use tracing::Level;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::Settings;
use crate::config::names::facility_code;
use crate::lock::Locked;

/// Where syslog lines go: the local syslog socket (`PGCARPOOL_SYSLOG_SOCKET` names another,
/// for tests).
pub fn syslog_socket() -> PathBuf {
    std::env::var_os("PGCARPOOL_SYSLOG_SOCKET")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/dev/log"))
}

/// The syslog severity of a tracing level.
fn severity(level: Level) -> u8 {
    match level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        Level::DEBUG | Level::TRACE => 7,
    }
}

/// What the process logs to; the targets change on reload.
struct Sink {
    stderr: AtomicBool,
    /// stderr output is coloured (a terminal, no logfile): ESC sequences are ours.
    ansi: AtomicBool,
    file: Mutex<Option<(PathBuf, File)>>,
    syslog: Mutex<Option<Syslog>>,
}

struct Syslog {
    ident: String,
    facility: u8,
    socket: Option<UnixDatagram>,
}

impl Syslog {
    fn new(settings: &Settings) -> Syslog {
        Syslog {
            ident: settings.syslog_ident.clone(),
            facility: facility_code(&settings.syslog_facility).unwrap_or(3),
            socket: None,
        }
    }

    /// Send one line; (re)connects when the socket is new or went away (syslog restarted).
    fn send(&mut self, level: Level, line: &[u8]) {
        let mut msg = format!(
            "<{}>{}[{}]: ",
            self.facility * 8 + severity(level),
            self.ident,
            std::process::id()
        )
        .into_bytes();
        msg.extend_from_slice(line.trim_ascii());
        for _ in 0..2 {
            if self.socket.is_none() {
                let sock = UnixDatagram::unbound().ok();
                self.socket = sock.filter(|s| s.connect(syslog_socket()).is_ok());
            }
            match &self.socket {
                Some(s) if s.send(&msg).is_ok() => return,
                Some(_) => self.socket = None,
                None => return,
            }
        }
    }
}

static SINK: OnceLock<Sink> = OnceLock::new();

/// How the binary logs.
pub struct Options<'a> {
    /// Write to stderr as well.
    pub stderr: bool,
    /// `-v` count (or `verbose`): 0 info, 1 debug, 2+ trace. `RUST_LOG` overrides.
    pub verbose: u8,
    pub settings: &'a Settings,
}

/// Install the process's log subscriber. Fails when the logfile cannot be opened.
pub fn init(opts: Options<'_>) -> anyhow::Result<()> {
    use tracing_subscriber::EnvFilter;
    let level = match opts.verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let file = match &opts.settings.logfile {
        Some(path) => Some((path.clone(), open_log(path)?)),
        None => None,
    };
    // Colours only for a terminal and no logfile: files and pipes get plain text.
    let ansi = opts.stderr
        && opts.settings.logfile.is_none()
        && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let sink = Sink {
        stderr: AtomicBool::new(opts.stderr),
        ansi: AtomicBool::new(ansi),
        file: Mutex::new(file),
        syslog: Mutex::new(opts.settings.syslog.then(|| Syslog::new(opts.settings))),
    };
    if SINK.set(sink).is_err() {
        anyhow::bail!("logging is already set up");
    }
    let sink = SINK.get().expect("just set");
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(format!("pgcarpool={level}")));
    set_flags(opts.settings);
    let main = tracing_subscriber::fmt::layer()
        .with_ansi(ansi)
        .event_format(Format {
            tracing: tracing_subscriber::fmt::format()
                .with_target(false)
                .with_ansi(ansi),
            header: true,
        })
        .with_writer(MainWriter(sink));
    let syslog = tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .event_format(Format {
            tracing: tracing_subscriber::fmt::format()
                .with_target(false)
                .with_ansi(false)
                .without_time()
                .with_level(false),
            header: false,
        })
        .with_writer(SyslogWriter(sink));
    tracing_subscriber::registry()
        .with(filter)
        .with(main)
        .with(syslog)
        .try_init()?;
    Ok(())
}

fn open_log(path: &Path) -> anyhow::Result<File> {
    use anyhow::Context;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("could not open logfile {}", path.display()))
}

/// Stop writing to stderr (`-d`, once the terminal is gone).
pub fn stderr_off() {
    if let Some(sink) = SINK.get() {
        sink.stderr.store(false, Ordering::Relaxed);
    }
}

/// Apply the logging settings of a (re)loaded config: reopen the logfile (the same path
/// after rotation, or a new one), start, stop or re-address syslog. A logfile that cannot
/// be opened keeps the old one, with an error in the log.
pub fn reopen(settings: &Settings) {
    set_flags(settings);
    let Some(sink) = SINK.get() else { return };
    let new = match &settings.logfile {
        Some(path) => match open_log(path) {
            Ok(f) => Some((path.clone(), f)),
            Err(e) => {
                tracing::error!("{e:#}: logging stays where it was");
                return;
            }
        },
        None => None,
    };
    // The change itself is logged by the reload (`reload: logfile: old -> new`).
    *lock(&sink.file) = new;
    *lock(&sink.syslog) = settings.syslog.then(|| Syslog::new(settings));
}

/// `log_format = pgbouncer` (the default) or `pgcarpool`; changes on reload.
static PGBOUNCER_FORMAT: AtomicBool = AtomicBool::new(true);

static LOG_CONNECTIONS: AtomicBool = AtomicBool::new(true);
static LOG_DISCONNECTIONS: AtomicBool = AtomicBool::new(true);

fn set_flags(settings: &Settings) {
    PGBOUNCER_FORMAT.store(settings.log_format != "pgcarpool", Ordering::Relaxed);
    LOG_CONNECTIONS.store(settings.log_connections, Ordering::Relaxed);
    LOG_DISCONNECTIONS.store(settings.log_disconnections, Ordering::Relaxed);
}

/// `log_connections`, for code that has no config at hand (server logins).
pub fn connections() -> bool {
    LOG_CONNECTIONS.load(Ordering::Relaxed)
}

/// `log_disconnections`, for code that has no config at hand (server closes).
pub fn disconnections() -> bool {
    LOG_DISCONNECTIONS.load(Ordering::Relaxed)
}

/// The event format of both layers: PgBouncer's lines ([`pgbouncer_line`]) or tracing's
/// own; `header` is false for syslog (which has its own time, ident and pid).
struct Format<F> {
    tracing: F,
    header: bool,
}

impl<S, N, F> tracing_subscriber::fmt::FormatEvent<S, N> for Format<F>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
    F: tracing_subscriber::fmt::FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut w: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        if !PGBOUNCER_FORMAT.load(Ordering::Relaxed) {
            return self.tracing.format_event(ctx, w, event);
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        let header = self.header.then(|| Header::now(*event.metadata().level()));
        writeln!(w, "{}", pgbouncer_line(header.as_ref(), &fields))
    }
}

/// The time, pid and level that start a PgBouncer log line.
struct Header {
    /// `2026-11-23 03:15:25.123 UTC` (local time and zone, as PgBouncer).
    time: String,
    pid: u32,
    level: &'static str,
}

impl Header {
    fn now(level: Level) -> Header {
        Header {
            time: local_time(std::time::SystemTime::now()),
            pid: std::process::id(),
            level: pgbouncer_level(level),
        }
    }
}

/// PgBouncer's names for the levels.
fn pgbouncer_level(level: Level) -> &'static str {
    match level {
        Level::ERROR => "ERROR",
        Level::WARN => "WARNING",
        Level::INFO => "LOG",
        Level::DEBUG => "DEBUG",
        Level::TRACE => "NOISE",
    }
}

/// `YYYY-MM-DD HH:MM:SS.mmm ZONE` in local time.
fn local_time(t: std::time::SystemTime) -> String {
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as libc::time_t;
    // SAFETY: localtime_r writes into the zeroed tm we own; tm_zone then points at static
    // zone data (or is null), read at once.
    unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&secs, &mut tm).is_null() {
            return format!("{secs}.{:03}", d.subsec_millis());
        }
        let zone = if tm.tm_zone.is_null() {
            "UTC".into()
        } else {
            std::ffi::CStr::from_ptr(tm.tm_zone).to_string_lossy()
        };
        format!(
            "{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:03} {zone}",
            tm.tm_year + 1900,
            tm.tm_mon + 1,
            tm.tm_mday,
            tm.tm_hour,
            tm.tm_min,
            tm.tm_sec,
            d.subsec_millis()
        )
    }
}

/// An event's fields, split into what PgBouncer's line prefix shows (`C-0x…: db/user@addr`)
/// and the rest.
#[derive(Default)]
struct Fields {
    message: String,
    client: Option<u64>,
    server: Option<u64>,
    db: Option<String>,
    user: Option<String>,
    addr: Option<String>,
    rest: String,
}

impl tracing::field::Visit for Fields {
    fn record_u64(&mut self, f: &tracing::field::Field, v: u64) {
        match f.name() {
            "client" => self.client = Some(v),
            "server" => self.server = Some(v),
            _ => self.record_debug(f, &v),
        }
    }
    fn record_i64(&mut self, f: &tracing::field::Field, v: i64) {
        match (f.name(), u64::try_from(v)) {
            ("client", Ok(v)) => self.client = Some(v),
            ("server", Ok(v)) => self.server = Some(v),
            _ => self.record_debug(f, &v),
        }
    }
    fn record_str(&mut self, f: &tracing::field::Field, v: &str) {
        self.record_debug(f, &format_args!("{v}"));
    }
    fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
        use std::fmt::Write as _;
        let text = || format!("{v:?}");
        match f.name() {
            "message" => self.message = text(),
            "db" => self.db = Some(text()),
            "user" => self.user = Some(text()),
            "addr" => self.addr = Some(text()),
            name => {
                let _ = write!(self.rest, " {name}={v:?}");
            }
        }
    }
}

/// One line as PgBouncer writes it:
/// `2026-11-23 03:15:25.123 UTC [4242] LOG C-0x00000000002a: db/user@127.0.0.1:5000 message`.
/// Events about a client or server carry `client`/`server` (its id) and `db`, `user`,
/// `addr`; other fields follow the message as ` key=value`.
fn pgbouncer_line(header: Option<&Header>, f: &Fields) -> String {
    use std::fmt::Write as _;
    let mut line = String::with_capacity(96 + f.message.len() + f.rest.len());
    if let Some(h) = header {
        let _ = write!(line, "{} [{}] {} ", h.time, h.pid, h.level);
    }
    let object = match (f.client, f.server) {
        (Some(id), _) => Some(('C', id)),
        (None, Some(id)) => Some(('S', id)),
        (None, None) => None,
    };
    let shown = |v: &Option<String>, none: &'static str| v.clone().unwrap_or(none.into());
    if let Some((kind, id)) = object {
        let _ = write!(
            line,
            "{kind}-0x{id:012x}: {}/{}@{} ",
            shown(&f.db, "(nodb)"),
            shown(&f.user, "(nouser)"),
            shown(&f.addr, "unix"),
        );
    } else {
        // No object: db/user/addr are plain fields.
        for (k, v) in [("db", &f.db), ("user", &f.user), ("addr", &f.addr)] {
            if let Some(v) = v {
                let _ = write!(line, "{k}={v} ");
            }
        }
    }
    line.push_str(&f.message);
    line.push_str(&f.rest);
    line
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.locked()
}

/// One formatted event, written out whole when dropped (one `write` per target, so lines
/// from different threads never interleave).
pub struct Line {
    sink: &'static Sink,
    buf: Vec<u8>,
    to: To,
}

enum To {
    /// stderr (when on) and the logfile (when set).
    Main,
    Syslog(Level),
    /// syslog is off: the bytes are dropped.
    Nowhere,
}

impl Write for Line {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if !matches!(self.to, To::Nowhere) {
            self.buf.extend_from_slice(b);
        }
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        let ansi = self.sink.ansi.load(Ordering::Relaxed);
        let line = escape_controls(&self.buf, ansi && matches!(self.to, To::Main));
        match self.to {
            To::Nowhere => {}
            To::Syslog(level) => {
                if let Some(s) = lock(&self.sink.syslog).as_mut() {
                    s.send(level, &line);
                }
            }
            To::Main => {
                if self.sink.stderr.load(Ordering::Relaxed) {
                    let _ = std::io::stderr().write_all(&line);
                }
                if let Some((_, f)) = lock(&self.sink.file).as_mut() {
                    let _ = f.write_all(&line);
                }
            }
        }
    }
}

/// One log line with every control character but its final newline (and tab) shown as
/// `\xNN`: what a client sends (a user name with a newline in it) cannot forge a line of
/// its own. ESC stays when the output is coloured (`keep_esc`).
pub fn escape_controls(line: &[u8], keep_esc: bool) -> std::borrow::Cow<'_, [u8]> {
    let body = line.strip_suffix(b"\n").unwrap_or(line);
    let bad = |b: u8| (b < 0x20 && b != b'\t' && !(keep_esc && b == 0x1b)) || b == 0x7f;
    if !body.iter().any(|&b| bad(b)) {
        return std::borrow::Cow::Borrowed(line);
    }
    let mut out = Vec::with_capacity(line.len() + 16);
    for &b in body {
        if bad(b) {
            out.extend_from_slice(format!("\\x{b:02x}").as_bytes());
        } else {
            out.push(b);
        }
    }
    if body.len() < line.len() {
        out.push(b'\n');
    }
    std::borrow::Cow::Owned(out)
}

/// stderr and the logfile.
struct MainWriter(&'static Sink);
/// Syslog (writes nothing while `syslog = 0`).
struct SyslogWriter(&'static Sink);

impl<'a> MakeWriter<'a> for MainWriter {
    type Writer = Line;
    fn make_writer(&'a self) -> Line {
        Line {
            sink: self.0,
            buf: Vec::new(),
            to: To::Main,
        }
    }
}

impl<'a> MakeWriter<'a> for SyslogWriter {
    type Writer = Line;
    fn make_writer(&'a self) -> Line {
        self.line(Level::INFO)
    }
    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Line {
        self.line(*meta.level())
    }
}

impl SyslogWriter {
    fn line(&self, level: Level) -> Line {
        let on = lock(&self.0.syslog).is_some();
        Line {
            sink: self.0,
            buf: Vec::new(),
            to: if on { To::Syslog(level) } else { To::Nowhere },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_but_the_final_newline_stays() {
        let forged = b"login user=x\n2030-01-01T00:00:00Z  INFO FAKE\r\x7f\tok\n";
        assert_eq!(
            &escape_controls(forged, false)[..],
            &b"login user=x\\x0a2030-01-01T00:00:00Z  INFO FAKE\\x0d\\x7f\tok\n"[..]
        );
        assert!(matches!(
            escape_controls(b"plain line\n", false),
            std::borrow::Cow::Borrowed(_)
        ));
        assert_eq!(&escape_controls(b"\x1b[1mx\n", true)[..], b"\x1b[1mx\n");
        assert_eq!(&escape_controls(b"\x1b[1mx\n", false)[..], b"\\x1b[1mx\n");
        assert_eq!(
            &escape_controls(b"no newline\x00", false)[..],
            b"no newline\\x00"
        );
    }

    fn fields(msg: &str) -> Fields {
        Fields {
            message: msg.into(),
            ..Fields::default()
        }
    }

    #[test]
    fn lines_look_like_pgbouncers() {
        let h = Header {
            time: "2026-11-23 03:15:25.123 UTC".into(),
            pid: 4242,
            level: pgbouncer_level(Level::INFO),
        };
        let f = Fields {
            client: Some(42),
            db: Some("p0".into()),
            user: Some("bob".into()),
            addr: Some("127.0.0.1:5000".into()),
            ..fields("login attempt: db=p0 user=bob tls=no replication=no")
        };
        assert_eq!(
            pgbouncer_line(Some(&h), &f),
            "2026-11-23 03:15:25.123 UTC [4242] LOG C-0x00000000002a: p0/bob@127.0.0.1:5000 \
             login attempt: db=p0 user=bob tls=no replication=no"
        );
        // A server, and a client not yet logged in.
        let f = Fields {
            server: Some(7),
            db: Some("p0".into()),
            user: Some("bob".into()),
            addr: Some("127.0.0.1:6666".into()),
            ..fields("closing because: connect failed (age=0s)")
        };
        assert_eq!(
            pgbouncer_line(None, &f),
            "S-0x000000000007: p0/bob@127.0.0.1:6666 closing because: connect failed (age=0s)"
        );
        let f = Fields {
            client: Some(1),
            addr: Some("127.0.0.1:5000".into()),
            ..fields("closing because: no such database: x (age=0s)")
        };
        assert!(
            pgbouncer_line(None, &f)
                .starts_with("C-0x000000000001: (nodb)/(nouser)@127.0.0.1:5000 closing")
        );
        // No object: other fields follow the message.
        let f = Fields {
            rest: " count=3".into(),
            db: Some("p0".into()),
            ..fields("stats")
        };
        assert_eq!(pgbouncer_line(None, &f), "db=p0 stats count=3");
        assert_eq!(pgbouncer_level(Level::WARN), "WARNING");
        assert_eq!(pgbouncer_level(Level::TRACE), "NOISE");
    }

    #[test]
    fn local_time_has_milliseconds_and_a_zone() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(1_795_000_000_123);
        let s = local_time(t);
        // 2026-11-18 ... in UTC; the zone is the machine's.
        assert!(s.len() >= 27, "{s}");
        assert_eq!(&s[19..23], ".123", "{s}");
        assert_eq!(&s[4..5], "-");
    }

    #[test]
    fn facilities_are_syslog_numbers() {
        assert_eq!(facility_code("daemon"), Some(3));
        assert_eq!(facility_code("local7"), Some(23));
        assert_eq!(facility_code("authpriv"), Some(10));
        assert_eq!(facility_code("nonsense"), None);
        assert_eq!(severity(Level::ERROR), 3);
        assert_eq!(severity(Level::INFO), 6);
    }
}
