//! A throw-away PostgreSQL cluster for the tests: `initdb` into a fresh
//! temporary directory, `pg_ctl start` on a free loopback port, and on drop
//! `pg_ctl stop` and the directory removed. It never touches a cluster it
//! did not create, and never listens beyond 127.0.0.1.
//!
//! The binaries are `$RFIDL_POSTGRES_BIN/{initdb,pg_ctl}`, else the newest
//! `/usr/lib/postgresql/*/bin`, else the folder of `initdb` on PATH, else the
//! Debian package `postgresql` is installed. PostgreSQL refuses to run as
//! root, so as root the cluster belongs to `nobody` and every PostgreSQL
//! command runs through `runuser -u nobody --`.
//!
//! The cluster trusts every loopback connection (`--auth=trust`): it holds
//! only test data and lives as long as one `cargo xtask` command. Two roles
//! are the exceptions, for the tests of the clients' failures (the tests
//! create them): `rfidl_password` must give its password (`scram-sha-256`)
//! and `rfidl_tls_only` is refused without TLS.
//!
//! The server speaks TLS too (`ssl = on`), with a certificate for
//! `localhost` and `127.0.0.1` signed by a CA made for this cluster alone
//! (rcgen, so no `openssl` binary is needed); the CA's certificate is
//! [`Cluster::ca_file`], its key is never written. A client that does not
//! ask for TLS gets a plain connection, as before.

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The superuser of the throw-away cluster (what the URL names).
const SUPERUSER: &str = "rfidl";
/// Who owns the cluster when xtask runs as root.
const UNPRIVILEGED_USER: &str = "nobody";
/// The role that must give its password, and the one refused without TLS:
/// their `pg_hba.conf` lines come before initdb's `trust` ones.
const HBA_EXCEPTIONS: &str = "\
# cargo xtask: the tests of password and TLS failures
host      all rfidl_password 127.0.0.1/32 scram-sha-256
hostnossl all rfidl_tls_only 127.0.0.1/32 reject
hostssl   all rfidl_tls_only 127.0.0.1/32 trust
";
/// The CA's certificate, the server's certificate and its key, in the
/// cluster's folder.
const CA_FILE: &str = "ca.pem";
const CERT_FILE: &str = "server.crt";
const KEY_FILE: &str = "server.key";
/// How often a start is tried again when another process took the free port
/// between our probe and the server's bind.
const START_ATTEMPTS: u32 = 3;

/// A running throw-away cluster; dropping it stops the server and removes
/// its directory (data, socket, log), also when the tests failed.
pub struct Cluster {
    dir: PathBuf,
    bin: PathBuf,
    /// `Some(user)` when the PostgreSQL commands run as that user (root).
    run_as: Option<&'static str>,
    port: u16,
}

impl Cluster {
    /// Finds (or installs) the binaries, creates and starts the cluster.
    /// The error names the cause, with the tail of the server's log.
    pub fn start() -> Result<Cluster, String> {
        let started = Instant::now();
        let bin = binaries()?;
        let run_as = crate::is_root().then_some(UNPRIVILEGED_USER);
        reap_orphans(&bin, run_as);
        let dir = std::env::temp_dir().join(format!(
            "{DIR_PREFIX}{}-{:x}",
            std::process::id(),
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos())
        ));
        {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        // From here on, dropping the value removes the directory.
        let mut cluster = Cluster {
            dir,
            bin,
            run_as,
            port: 0,
        };
        if let Some(user) = run_as {
            let (uid, gid) = user_ids(user)?;
            std::os::unix::fs::chown(&cluster.dir, Some(uid), Some(gid))
                .map_err(|e| format!("cannot hand {} to {user}: {e}", cluster.dir.display()))?;
            // initdb's own message would only say "Permission denied".
            let reachable = Command::new("runuser")
                .args(["-u", user, "--", "test", "-w"])
                .arg(&cluster.dir)
                .status()
                .is_ok_and(|status| status.success());
            if !reachable {
                return Err(format!(
                    "{user} (who runs PostgreSQL, as it refuses root) cannot write {}: set TMPDIR \
                     to a folder every user can reach, such as /tmp",
                    cluster.dir.display()
                ));
            }
        }
        cluster.init()?;
        cluster.run_server()?;
        eprintln!(
            "xtask: PostgreSQL ({}) on 127.0.0.1:{} in {}, ready in {} ms",
            cluster.bin.display(),
            cluster.port,
            cluster.dir.display(),
            started.elapsed().as_millis()
        );
        Ok(cluster)
    }

    /// `postgres://rfidl@127.0.0.1:PORT/postgres`: the superuser, trusted on
    /// loopback, and the maintenance database.
    pub fn url(&self) -> String {
        format!("postgres://{SUPERUSER}@127.0.0.1:{}/postgres", self.port)
    }

    /// The PEM file of the CA that signed the server's certificate (for
    /// `sslmode=verify-full&sslrootcert=…`), readable by xtask's user.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join(CA_FILE)
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn log(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    /// A PostgreSQL program of the cluster's binaries, run as its owner.
    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        let mut command = match self.run_as {
            Some(user) => {
                let mut runuser = Command::new("runuser");
                runuser.args(["-u", user, "--"]).arg(path);
                runuser
            }
            None => Command::new(path),
        };
        // Messages in English, whatever the developer's locale: the error
        // tails we print must be readable in an issue.
        command.env("LC_ALL", "C");
        // The cluster's owner may not be allowed into xtask's working
        // directory (a checkout under /root); the cluster's folder is its own.
        command.current_dir(&self.dir);
        command
    }

    fn init(&self) -> Result<(), String> {
        let mut initdb = self.command("initdb");
        initdb
            .arg("-D")
            .arg(self.data())
            .args(["-U", SUPERUSER, "--auth=trust", "-E", "UTF8", "--locale=C"])
            // initdb's own final fsync of the new files: the cluster is
            // thrown away, so a power cut during set-up loses nothing. The
            // server itself runs with fsync on.
            .arg("--no-sync");
        checked(&mut initdb, None)
            .map_err(|e| format!("cannot create the test PostgreSQL cluster: {e}"))?;
        self.write_certificates()?;
        // Settings for every start; the port is chosen per start (-p).
        let settings = format!(
            "\n# cargo xtask: a throw-away cluster for the tests\n\
             listen_addresses = '127.0.0.1'\n\
             unix_socket_directories = '{dir}'\n\
             fsync = on\n\
             max_connections = 200\n\
             ssl = on\n\
             ssl_cert_file = '{dir}/{CERT_FILE}'\n\
             ssl_key_file = '{dir}/{KEY_FILE}'\n",
            dir = self.dir.display()
        );
        let conf = self.data().join("postgresql.conf");
        std::fs::OpenOptions::new()
            .append(true)
            .open(&conf)
            .and_then(|mut file| file.write_all(settings.as_bytes()))
            .map_err(|e| format!("cannot write {}: {e}", conf.display()))?;
        // The first matching line decides: the exceptions go first.
        let hba = self.data().join("pg_hba.conf");
        std::fs::read_to_string(&hba)
            .and_then(|trusted| std::fs::write(&hba, format!("{HBA_EXCEPTIONS}\n{trusted}")))
            .map_err(|e| format!("cannot write {}: {e}", hba.display()))
    }

    /// A CA of the cluster's own and the server's certificate for
    /// `localhost` and `127.0.0.1`, signed by it, in the cluster's folder.
    /// PostgreSQL refuses a key that others can read or that is not its
    /// user's: 0600, owned by the server's user.
    fn write_certificates(&self) -> Result<(), String> {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
            KeyUsagePurpose,
        };
        let failed =
            |e: rcgen::Error| format!("cannot make the test PostgreSQL's certificates: {e}");
        let ca_key = KeyPair::generate().map_err(failed)?;
        let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(failed)?;
        ca.distinguished_name
            .push(DnType::CommonName, "rfidl test PostgreSQL CA");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = ca.self_signed(&ca_key).map_err(failed)?;
        let key = KeyPair::generate().map_err(failed)?;
        let mut server =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
                .map_err(failed)?;
        server
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        server.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server = server.signed_by(&key, &ca, &ca_key).map_err(failed)?;
        let owner = self.run_as.map(user_ids).transpose()?;
        for (name, text, mode) in [
            (CA_FILE, ca.pem(), 0o644),
            (CERT_FILE, server.pem(), 0o644),
            (KEY_FILE, key.serialize_pem(), 0o600),
        ] {
            let path = self.dir.join(name);
            write_private(&path, text.as_bytes(), mode, owner)
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        }
        Ok(())
    }

    fn run_server(&mut self) -> Result<(), String> {
        let mut attempt = 1;
        loop {
            self.port = free_port()?;
            let mut start = self.command("pg_ctl");
            start
                .arg("-D")
                .arg(self.data())
                .arg("-l")
                .arg(self.log())
                .args(["-w", "-t", "60", "-o"])
                .arg(format!("-p {}", self.port))
                .arg("start");
            match checked(&mut start, Some(&self.log())) {
                Err(message)
                    if attempt < START_ATTEMPTS && message.contains("Address already in use") =>
                {
                    eprintln!(
                        "xtask: port {} was taken meanwhile; trying another",
                        self.port
                    );
                    attempt += 1;
                }
                Err(message) => {
                    return Err(format!("the test PostgreSQL did not start: {message}"));
                }
                Ok(()) => break,
            }
        }
        // pg_ctl -w waits for "ready"; the port must answer too.
        let address = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        TcpStream::connect_timeout(&address, Duration::from_secs(5))
            .map(drop)
            .map_err(|e| {
                format!(
                    "PostgreSQL started but 127.0.0.1:{} does not answer: {e}{}",
                    self.port,
                    log_tail(&self.log())
                )
            })
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Only a started server leaves its pid file.
        if self.data().join("postmaster.pid").exists() {
            let stop = |mode: &str| {
                let mut command = self.command("pg_ctl");
                command
                    .arg("-D")
                    .arg(self.data())
                    .args(["-m", mode, "-w", "-t", "30", "stop"]);
                checked(&mut command, None)
            };
            // fast: disconnects the tests' sessions and shuts down cleanly;
            // immediate when that did not finish (nothing here is worth
            // keeping).
            if let Err(message) = stop("fast").or_else(|e| {
                eprintln!("xtask: pg_ctl stop -m fast: {e}");
                stop("immediate")
            }) {
                // Its files stay: removing them under a running server
                // would leave it unstoppable.
                eprintln!(
                    "xtask: cannot stop the test PostgreSQL in {}: {message}",
                    self.dir.display()
                );
                return;
            }
        }
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            eprintln!("xtask: cannot remove {}: {e}", self.dir.display());
        }
    }
}

/// The prefix of the clusters' folders in the temporary directory, followed
/// by the process id of the xtask that owns the cluster.
const DIR_PREFIX: &str = "rfidl-pg-";

/// Stops and removes the clusters whose xtask died without doing it
/// (SIGKILL, a closed terminal): a server nobody will stop otherwise. A
/// cluster whose process id is alive is left alone, whoever has it now.
fn reap_orphans(bin: &Path, run_as: Option<&'static str>) {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|name| name.strip_prefix(DIR_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if alive(pid) {
            continue;
        }
        eprintln!(
            "xtask: stopping and removing {}, left by xtask process {pid}",
            entry.path().display()
        );
        drop(Cluster {
            dir: entry.path(),
            bin: bin.to_path_buf(),
            run_as,
            port: 0,
        });
    }
}

/// Whether process `pid` runs (exists and is not a zombie waiting for its
/// parent).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // "pid (name) state …": the name may hold spaces and parentheses.
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
    })
}

/// The folder holding `initdb` and `pg_ctl` (see the module docs for the
/// order); installs the Debian package `postgresql` when none has them.
pub fn binaries() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("RFIDL_POSTGRES_BIN") {
        let dir = PathBuf::from(dir);
        return if has_binaries(&dir) {
            Ok(dir)
        } else {
            Err(format!(
                "RFIDL_POSTGRES_BIN={} has no initdb and pg_ctl",
                dir.display()
            ))
        };
    }
    if let Some(dir) = installed() {
        return Ok(dir);
    }
    crate::apt_install("postgresql")?;
    installed().ok_or_else(|| {
        "the Debian package postgresql is installed but neither /usr/lib/postgresql/*/bin nor \
         PATH has initdb and pg_ctl: set RFIDL_POSTGRES_BIN to their folder"
            .to_owned()
    })
}

/// The newest `/usr/lib/postgresql/<version>/bin`, else the folder of
/// `initdb` on PATH.
fn installed() -> Option<PathBuf> {
    let versioned = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version: Vec<u32> = entry
                .file_name()
                .to_str()?
                .split('.')
                .map(str::parse)
                .collect::<Result<_, _>>()
                .ok()?;
            let bin = entry.path().join("bin");
            has_binaries(&bin).then_some((version, bin))
        })
        .max_by(|a, b| a.0.cmp(&b.0))
        .map(|(_, bin)| bin);
    versioned
        .or_else(|| std::env::split_paths(&std::env::var_os("PATH")?).find(|dir| has_binaries(dir)))
}

fn has_binaries(dir: &Path) -> bool {
    dir.join("initdb").is_file() && dir.join("pg_ctl").is_file()
}

/// A loopback port nobody listens on right now (bound, read, released).
fn free_port() -> Result<u16, String> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .map_err(|e| format!("cannot find a free loopback port: {e}"))
}

/// Creates `path` with `mode` from the start (the key is never readable by
/// others, not even for a moment), then hands it to `owner` when given.
fn write_private(
    path: &Path,
    bytes: &[u8],
    mode: u32,
    owner: Option<(u32, u32)>,
) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)?;
    file.write_all(bytes)?;
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::fchown(&file, Some(uid), Some(gid))?;
    }
    Ok(())
}

/// The numeric uid and gid of `user` (`id -u`, `id -g`).
fn user_ids(user: &str) -> Result<(u32, u32), String> {
    let id = |flag: &str| -> Result<u32, String> {
        let output = Command::new("id")
            .args([flag, user])
            .output()
            .map_err(|e| format!("cannot run id: {e}"))?;
        String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse()
            .map_err(|_| {
                format!(
                    "PostgreSQL cannot run as root and there is no user {user} to run it: {}",
                    String::from_utf8_lossy(&output.stderr).trim()
                )
            })
    };
    Ok((id("-u")?, id("-g")?))
}

/// Runs `command` with its output captured; a failure carries the output
/// and, when given, the tail of `log`.
fn checked(command: &mut Command, log: Option<&Path>) -> Result<(), String> {
    let output: Output = command
        .output()
        .map_err(|e| format!("cannot start {command:?}: {e}"))?;
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "{command:?} failed with {}\n{}{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
        log.map(log_tail).unwrap_or_default()
    ))
}

/// The last lines of the server log, to say why it did not start.
fn log_tail(log: &Path) -> String {
    match std::fs::read_to_string(log) {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(20)..].join("\n");
            format!("\n--- last lines of {} ---\n{tail}", log.display())
        }
        Err(e) => format!("\n(no server log at {}: {e})", log.display()),
    }
}
