//! pgcarpool command line, with PgBouncer's flags.

/// jemalloc, not glibc's malloc: idle clients by the thousand are small allocations and
/// 128-byte-aligned ones (tokio's task cells and socket registrations), which glibc pads
/// and scatters; jemalloc's size classes fit them (RSS per idle client 1,665 -> 1,381
/// bytes, bench/idle_memory.py, 5,000 SCRAM clients; CPU per transaction unchanged or
/// lower in bench/perfstat.sh).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Parser;
use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use pgcarpool::cli::Cli;
use pgcarpool::net::listen::Bound;
use pgcarpool::takeover::Predecessor;

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let logging = std::cell::Cell::new(false);
    match run(cli, &logging) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // Printed here, not returned: an error is one line (no backtrace with
        // RUST_BACKTRACE set), in the log when it is set up (stderr, logfile, syslog).
        Err(e) if logging.get() => {
            tracing::error!("{e:#}");
            std::process::ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("pgcarpool: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli, logging: &std::cell::Cell<bool>) -> anyhow::Result<()> {
    let Some(config) = &cli.config else {
        // Only -V leaves out the config file (clap enforces it).
        println!("{}", pgcarpool::cli::version_line());
        return Ok(());
    };
    let (config, pass_sockets) = load(&cli, config)?;
    let verbose = cli.verbose.max(config.settings.verbose);
    pgcarpool::logging::init(pgcarpool::logging::Options {
        stderr: !cli.quiet,
        verbose,
        settings: &config.settings,
    })?;
    logging.set(true);
    // -R: the process to take over is the one the pidfile names (read before we overwrite it).
    let predecessor = match (&config.settings.pidfile, cli.reboot) {
        (Some(pidfile), true) => running_pgcarpool(pidfile),
        _ => None,
    };
    // -R without so_reuseport: the running process's listening sockets, passed over its
    // console (it is suspended until this process asks for its clients).
    let taken = if pass_sockets {
        pgcarpool::takeover::take_listeners(&config.settings)?
    } else {
        None
    };
    // -R with SO_REUSEPORT: the running process's console, reached before its Unix socket
    // is renamed over, to take its clients once this process listens.
    let clients_from = if cli.reboot && !pass_sockets {
        pgcarpool::takeover::console_for_clients(&config.settings)
    } else {
        None
    };
    // Everything that can fail is checked before -d forks, so the error reaches the
    // terminal and the exit code: the pidfile (another instance running?), then the
    // listening sockets (or those systemd passed).
    let pidfile = match &config.settings.pidfile {
        Some(p) if predecessor.is_none() && taken.is_none() => Some(Pidfile::claim(p)?),
        Some(p) => Some(Pidfile::take_over(p)),
        None => None,
    };
    let (listeners, taken_from) = listeners(&config.settings, cli.reboot, taken, clients_from)?;
    if cli.daemon {
        daemonize()?;
        pgcarpool::logging::stderr_off();
    }
    if let Some(p) = &pidfile {
        p.write_own_pid()?;
    }
    raise_fd_limit(config.settings.max_client_conn);
    // This thread is worker 0; `app::start_on` starts the others (thread per core).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(serve(config, listeners, taken_from, predecessor));
    if let Some(p) = pidfile {
        p.release(predecessor, result.is_err());
    }
    if result.is_ok() {
        tracing::info!("shutdown complete");
    }
    result
}

/// The config file, and whether `-R` takes the running process's sockets over (without
/// so_reuseport) rather than sharing its port (with it, set here). Runs as the user to run
/// as (switched to here), never root; `-d` needs a pidfile.
fn load(cli: &Cli, path: &Path) -> anyhow::Result<(pgcarpool::config::Config, bool)> {
    let config_path = std::fs::canonicalize(path).unwrap_or(path.to_path_buf());
    let mut config =
        pgcarpool::config::Config::load(&config_path).map_err(|e| anyhow::anyhow!("{e}"))?;
    // -R: with so_reuseport the new process shares the port; without, it takes the
    // sockets from the running one over its Unix socket (PgBouncer's way).
    let pass_sockets = cli.reboot && !config.settings.so_reuseport;
    if cli.reboot && !pass_sockets {
        config.settings.so_reuseport = true;
    }
    if let Some(user) = cli.user.as_deref().or(config.settings.user.as_deref()) {
        switch_user(user)?;
    }
    if nix::unistd::getuid().is_root() {
        anyhow::bail!(
            "pgcarpool should not run as root: start it as another user, or name one with -u USER (or user = in the config)"
        );
    }
    if cli.daemon && config.settings.pidfile.is_none() {
        anyhow::bail!("-d needs a pidfile set in the config");
    }
    Ok((config, pass_sockets))
}

/// The sockets to listen on: those `-R` took from the running process, else those systemd
/// passed, else bound here; and the running process to take the clients of, if any.
fn listeners(
    settings: &pgcarpool::config::Settings,
    reboot: bool,
    taken: Option<(Predecessor, Vec<Bound>)>,
    clients_from: Option<Predecessor>,
) -> anyhow::Result<(Vec<Bound>, Option<Predecessor>)> {
    Ok(match taken {
        Some((from, listeners)) => (listeners, Some(from)),
        None if clients_from.is_some() => {
            (pgcarpool::net::listen::bind(settings, true)?, clients_from)
        }
        None => match pgcarpool::net::listen::from_systemd()? {
            Some(passed) => {
                tracing::info!(
                    "{} socket(s) passed by the service manager: listen_addr and unix_socket_dir are not used",
                    passed.len()
                );
                (passed, None)
            }
            None => (pgcarpool::net::listen::bind(settings, reboot)?, None),
        },
    })
}

/// Run the pooler until it shuts down: start it on `listeners`, say it is ready, then
/// take the clients of the process `-R` replaces (or ask it to finish) and serve signals.
async fn serve(
    config: pgcarpool::config::Config,
    listeners: Vec<Bound>,
    taken_from: Option<Predecessor>,
    predecessor: Option<i32>,
) -> anyhow::Result<()> {
    let workers = pgcarpool::workers::count(config.settings.workers);
    let status = format!(
        "listening on {}",
        listeners
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
    let signals = pgcarpool::signals::install()?;
    let handle = pgcarpool::app::start_on(config, listeners).await?;
    tracing::info!(
        "process up: pgcarpool {}, {workers} worker threads",
        env!("CARGO_PKG_VERSION")
    );
    pgcarpool::service::ready(&status);
    if let Some(from) = taken_from {
        // The old process sends its idle clients, then exits; no signal needed.
        let shared = handle.shared.clone();
        handle
            .shared
            .tracker()
            .spawn(async move { from.take_clients(shared).await });
    } else if let Some(pid) = predecessor {
        tracing::info!("took over from pgcarpool {pid}: asking it to finish (SIGTERM)");
        if let Err(e) = kill(Pid::from_raw(pid), Signal::SIGTERM) {
            tracing::warn!(
                "could not signal pgcarpool {pid}: {}",
                std::io::Error::from(e)
            );
        }
    }
    pgcarpool::signals::run(signals, handle.shared.clone()).await?;
    handle.shutdown().await;
    Ok(())
}

/// The pidfile this process wrote (or, after `-R`, took over from its predecessor).
struct Pidfile {
    path: PathBuf,
}

impl Pidfile {
    /// As PgBouncer: a pidfile naming a live process means another instance runs (refuse);
    /// one naming no process is stale (removed). Created exclusively, so two instances
    /// started at once cannot both pass.
    fn claim(path: &Path) -> anyhow::Result<Pidfile> {
        if let Some(pid) = read_pid(path) {
            if process_alive(pid) {
                anyhow::bail!(
                    "pidfile {} exists, another instance running? (PID {pid})",
                    path.display()
                );
            }
            tracing::info!(
                "stale pidfile {} (PID {pid} is gone), removing",
                path.display()
            );
            std::fs::remove_file(path)
                .with_context(|| format!("could not remove stale pidfile {}", path.display()))?;
        } else if path.exists() {
            anyhow::bail!(
                "pidfile {} exists but holds no PID: remove it if no pgcarpool runs",
                path.display()
            );
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .with_context(|| format!("could not create pidfile {}", path.display()))?;
        std::io::Write::write_all(&mut f, format!("{}\n", std::process::id()).as_bytes())
            .with_context(|| format!("could not write pidfile {}", path.display()))?;
        Ok(Pidfile {
            path: path.to_path_buf(),
        })
    }

    /// `-R`: the pidfile names the running instance; it becomes ours once we listen.
    fn take_over(path: &Path) -> Pidfile {
        Pidfile {
            path: path.to_path_buf(),
        }
    }

    /// Write this process's PID (after `-d` forked: the daemon's).
    fn write_own_pid(&self) -> anyhow::Result<()> {
        std::fs::write(&self.path, format!("{}\n", std::process::id()))
            .with_context(|| format!("could not write pidfile {}", self.path.display()))
    }

    /// At exit: remove the pidfile while it names us. After a takeover our successor owns
    /// it; a takeover that failed gives it back to the process still running.
    fn release(self, predecessor: Option<i32>, failed: bool) {
        if read_pid(&self.path) != Some(std::process::id()) {
            return;
        }
        match (predecessor, failed) {
            (Some(pid), true) => {
                let _ = std::fs::write(&self.path, format!("{pid}\n"));
            }
            _ => {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

/// A process with this PID exists (signal 0; EPERM: it exists, owned by another user).
fn process_alive(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    matches!(kill(Pid::from_raw(pid), None), Ok(()) | Err(Errno::EPERM))
}

fn read_pid(pidfile: &std::path::Path) -> Option<u32> {
    std::fs::read_to_string(pidfile).ok()?.trim().parse().ok()
}

/// The PID in `pidfile` if it is another running pgcarpool (not a stale PID reused by
/// some other program).
fn running_pgcarpool(pidfile: &std::path::Path) -> Option<i32> {
    let pid = read_pid(pidfile).filter(|&p| p != std::process::id())?;
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    let ours = std::fs::read_to_string("/proc/self/comm").ok()?;
    (comm == ours).then(|| i32::try_from(pid).ok()).flatten()
}

/// Raise the soft limit on open files to the hard limit: every client and server is a
/// descriptor, and the usual soft limit (1024) is below max_client_conn on busy poolers.
/// Warns when even the hard limit is below what max_client_conn needs.
fn raise_fd_limit(max_client_conn: usize) {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((mut soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        soft = hard;
    }
    // Clients, a server each at worst, and some room for listeners and logs.
    let needed = (max_client_conn as u64)
        .saturating_mul(2)
        .saturating_add(64);
    if soft != libc::RLIM_INFINITY && soft < needed {
        tracing::warn!(
            "open files limit is {} but max_client_conn = {max_client_conn} may need {needed}: \
             raise it (ulimit -n, LimitNOFILE=)",
            soft
        );
    }
}

/// Fork into the background, detach from the terminal (fork, setsid, fork again so the
/// daemon is no session leader, as PgBouncer). The parents exit 0 at once: everything
/// that can fail was checked before.
fn daemonize() -> anyhow::Result<()> {
    use nix::fcntl::{OFlag, open};
    use nix::sys::stat::Mode;
    use nix::unistd::{ForkResult, dup2_stderr, dup2_stdin, dup2_stdout, fork, setsid};
    use std::os::fd::{AsRawFd, IntoRawFd};
    let devnull = open("/dev/null", OFlag::O_RDWR, Mode::empty())
        .map_err(|e| anyhow::anyhow!("could not open /dev/null: {}", std::io::Error::from(e)))?;
    for step in 0..2 {
        // SAFETY: no other thread runs yet (the runtime is built afterwards), so the child
        // goes on as the process did; the parent leaves with _exit, running no destructors
        // and flushing no buffer (the sockets and pidfile are the daemon's).
        unsafe {
            match fork() {
                Err(e) => anyhow::bail!("fork failed: {}", std::io::Error::from(e)),
                Ok(ForkResult::Parent { .. }) => libc::_exit(0),
                Ok(ForkResult::Child) => {}
            }
        }
        if step == 0 {
            setsid().map_err(|e| anyhow::anyhow!("setsid failed: {}", std::io::Error::from(e)))?;
        }
    }
    let _ = dup2_stdin(&devnull);
    let _ = dup2_stdout(&devnull);
    let _ = dup2_stderr(&devnull);
    if devnull.as_raw_fd() <= 2 {
        // /dev/null came as stdin, stdout or stderr (one was closed): it stays open as such.
        let _ = devnull.into_raw_fd();
    }
    Ok(())
}

fn switch_user(name: &str) -> anyhow::Result<()> {
    use nix::unistd::{User, setgid, setuid};
    let Ok(Some(pw)) = User::from_name(name) else {
        anyhow::bail!("unknown user {name}");
    };
    if setgid(pw.gid).is_err() || setuid(pw.uid).is_err() {
        anyhow::bail!("could not switch to user {name}");
    }
    Ok(())
}
