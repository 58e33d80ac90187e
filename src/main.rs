//! pgcarpool command line, with PgBouncer's flags.
use anyhow::Context;
use clap::Parser;
use pgcarpool::cli::Cli;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let config_path = std::fs::canonicalize(&cli.config).unwrap_or(cli.config.clone());
    let mut config =
        pgcarpool::config::Config::load(&config_path).map_err(|e| anyhow::anyhow!("{e}"))?;
    if cli.reboot {
        config.settings.so_reuseport = true;
    }
    let verbose = cli.verbose.max(config.settings.verbose);
    if let Some(user) = cli.user.as_deref().or(config.settings.user.as_deref()) {
        switch_user(user)?;
    }
    if cli.daemon {
        let (Some(_), Some(_)) = (&config.settings.logfile, &config.settings.pidfile) else {
            anyhow::bail!("-d needs logfile and pidfile set in the config");
        };
        daemonize()?;
    }
    init_logging(
        cli.quiet || cli.daemon,
        verbose,
        config.settings.logfile.as_deref(),
    )?;
    // -R: the process to take over is the one the pidfile names (read before we overwrite it).
    let predecessor = match (&config.settings.pidfile, cli.reboot) {
        (Some(pidfile), true) => running_pgcarpool(pidfile),
        _ => None,
    };
    if let Some(pidfile) = &config.settings.pidfile {
        std::fs::write(pidfile, format!("{}\n", std::process::id()))
            .with_context(|| format!("writing pidfile {}", pidfile.display()))?;
    }
    raise_fd_limit(config.settings.max_client_conn);
    let workers = pgcarpool::workers::count(config.settings.workers);
    let pidfile = config.settings.pidfile.clone();
    // This thread is worker 0; `app::start_with` starts the others (thread per core).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(async move {
        let how = if cli.reboot {
            pgcarpool::app::Start::Takeover
        } else {
            pgcarpool::app::Start::Fresh
        };
        let handle = pgcarpool::app::start_with(config, how)
            .await
            .context("starting listeners")?;
        tracing::info!("listening on {} ({} worker threads)", handle.addr, workers);
        if let Some(pid) = predecessor {
            tracing::info!("took over from pgcarpool {pid}: asking it to finish (SIGTERM)");
            // SAFETY: kill(2) on the PID of the pgcarpool our pidfile named, checked just before.
            if unsafe { libc::kill(pid, libc::SIGTERM) } != 0 {
                tracing::warn!(
                    "could not signal pgcarpool {pid}: {}",
                    std::io::Error::last_os_error()
                );
            }
        }
        pgcarpool::signals::run(handle.shared.clone(), config_path).await?;
        handle.shutdown().await;
        anyhow::Ok(())
    });
    // After a takeover the pidfile names our successor: leave it. A takeover that failed
    // gives the pidfile back to the process still running.
    if let Some(p) = pidfile
        && read_pid(&p) == Some(std::process::id())
    {
        match (predecessor, &result) {
            (Some(pid), Err(_)) => {
                let _ = std::fs::write(&p, format!("{pid}\n"));
            }
            _ => {
                let _ = std::fs::remove_file(p);
            }
        }
    }
    result
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

fn init_logging(quiet: bool, verbose: u8, logfile: Option<&std::path::Path>) -> anyhow::Result<()> {
    use tracing_subscriber::EnvFilter;
    let level = match verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(format!("pgcarpool={level}")));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    match logfile {
        Some(path) => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("opening logfile {}", path.display()))?;
            builder
                .with_ansi(false)
                .with_writer(std::sync::Mutex::new(file))
                .init();
        }
        None if quiet => builder.with_writer(std::io::sink).init(),
        // Colours only for a terminal: redirected logs stay plain text (and cheaper).
        None => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_writer(std::io::stderr)
            .init(),
    }
    Ok(())
}

/// Raise the soft limit on open files to the hard limit: every client and server is a
/// descriptor, and the usual soft limit (1024) is below max_client_conn on busy poolers.
/// Warns when even the hard limit is below what max_client_conn needs.
fn raise_fd_limit(max_client_conn: usize) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to an rlimit struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim = raised;
            }
        }
    }
    // Clients, a server each at worst, and some room for listeners and logs.
    let needed = (max_client_conn as u64)
        .saturating_mul(2)
        .saturating_add(64);
    if lim.rlim_cur != libc::RLIM_INFINITY && lim.rlim_cur < needed {
        tracing::warn!(
            "open files limit is {} but max_client_conn = {max_client_conn} may need {needed}: \
             raise it (ulimit -n, LimitNOFILE=)",
            lim.rlim_cur
        );
    }
}

/// Fork into the background, detach from the terminal.
fn daemonize() -> anyhow::Result<()> {
    // SAFETY: called before any thread is started (the runtime is built afterwards).
    unsafe {
        match libc::fork() {
            -1 => anyhow::bail!("fork failed"),
            0 => {}
            _ => libc::_exit(0),
        }
        libc::setsid();
        let devnull = std::ffi::CString::new("/dev/null")?;
        let fd = libc::open(devnull.as_ptr(), libc::O_RDWR);
        if fd >= 0 {
            libc::dup2(fd, 0);
            libc::dup2(fd, 1);
            libc::dup2(fd, 2);
        }
    }
    Ok(())
}

fn switch_user(name: &str) -> anyhow::Result<()> {
    let cname = std::ffi::CString::new(name)?;
    // SAFETY: getpwnam returns a pointer to static storage, read at once.
    unsafe {
        let pw = libc::getpwnam(cname.as_ptr());
        if pw.is_null() {
            anyhow::bail!("unknown user {name}");
        }
        if libc::setgid((*pw).pw_gid) != 0 || libc::setuid((*pw).pw_uid) != 0 {
            anyhow::bail!("could not switch to user {name}");
        }
    }
    Ok(())
}
