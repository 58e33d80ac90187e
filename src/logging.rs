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

/// Where syslog lines go: the local syslog socket (`PGCARPOOL_SYSLOG_SOCKET` names another,
/// for tests).
pub fn syslog_socket() -> PathBuf {
    std::env::var_os("PGCARPOOL_SYSLOG_SOCKET")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/dev/log"))
}

/// The numeric syslog facility for a `syslog_facility` name.
pub fn facility_code(name: &str) -> Option<u8> {
    Some(match name {
        "kern" => 0,
        "user" => 1,
        "mail" => 2,
        "daemon" => 3,
        "auth" => 4,
        "syslog" => 5,
        "lpr" => 6,
        "news" => 7,
        "uucp" => 8,
        "cron" => 9,
        "authpriv" => 10,
        "ftp" => 11,
        "local0" => 16,
        "local1" => 17,
        "local2" => 18,
        "local3" => 19,
        "local4" => 20,
        "local5" => 21,
        "local6" => 22,
        "local7" => 23,
        _ => return None,
    })
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
    let main = tracing_subscriber::fmt::layer()
        .with_target(false)
        .with_ansi(ansi)
        .with_writer(MainWriter(sink));
    let syslog = tracing_subscriber::fmt::layer()
        .with_target(false)
        .with_ansi(false)
        .without_time()
        .with_level(false)
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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
