//! The demo services as processes on sqlx PostgreSQL, each on a database of
//! its own: the engine and then HR SIGKILLed mid-stream and restarted on
//! the same database and port. The verdict (read from both databases) must
//! be exactly once: one workflow and one ticket per hire, nothing orphaned
//! or left for an operator.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rfidl_examples::demo::{Database, count, verdict::verdict_of};
use rfidl_runtime::signing::Secret;

use crate::postgres;

/// Quick retries, and a 3 s lease so rows a killed sender left `Sending`
/// are claimed again soon after its restart.
const CONFIG: &str = "
outbox:
  backoff_base: 100ms
  backoff_max: 1s
  jitter: 50ms
  max_retries: 50
  request_timeout: 2s
  lease_timeout: 3s
";

/// What both services are started with.
struct Pair {
    hr_db: String,
    engine_db: String,
    ports: [u16; 2],
    secrets: [String; 2],
    config: std::path::PathBuf,
}

impl Pair {
    /// `hr-service` (`hr`) or `engine` on its database, hiring `hires` if HR.
    fn start(&self, hr: bool, hires: u32) -> Child {
        let (bin, db, [own, peer], [secret, peer_secret]) = if hr {
            let ports = self.ports;
            let secrets = self.secrets.clone();
            (
                env!("CARGO_BIN_EXE_hr-service"),
                &self.hr_db,
                ports,
                secrets,
            )
        } else {
            let [a, b] = self.ports;
            let [s, t] = self.secrets.clone();
            (
                env!("CARGO_BIN_EXE_engine"),
                &self.engine_db,
                [b, a],
                [t, s],
            )
        };
        let mut command = Command::new(bin);
        command
            .args(["--listen", &format!("127.0.0.1:{own}"), "--db", db])
            .args(["--peer-url", &format!("http://127.0.0.1:{peer}")])
            .args(["--secret", &secret, "--peer-secret", &peer_secret])
            .arg("--config")
            .arg(&self.config)
            .stdout(Stdio::null());
        if hr {
            command.args(["--hire", &hires.to_string(), "--exit-when-done"]);
        }
        command.spawn().expect("start a demo service")
    }
}

/// Waits until `sql` on `db` counts at least `at_least`.
fn wait_for(db: &Database, sql: &str, at_least: i64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while count(db, sql).unwrap_or(0) < at_least {
        assert!(Instant::now() < deadline, "never reached {at_least}: {sql}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn kill(child: &mut Child) {
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
}

#[test]
fn exactly_once_on_postgresql_across_a_sigkilled_engine_and_a_sigkilled_sender() {
    let (Some(hr_db), Some(engine_db)) = (postgres::database(), postgres::database()) else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, CONFIG).expect("config");
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port()
    };
    let pair = Pair {
        hr_db: hr_db.url().to_owned(),
        engine_db: engine_db.url().to_owned(),
        ports: [free(), free()],
        secrets: [Secret::generate().to_whsec(), Secret::generate().to_whsec()],
        config,
    };
    let (hr_database, engine_database) = (
        Database::parse(&pair.hr_db).expect("URL"),
        Database::parse(&pair.engine_db).expect("URL"),
    );
    let hires = 300;
    let mut engine = pair.start(false, 0);
    let mut hr = pair.start(true, hires);

    // The engine dies with workflows half done, then HR with hires and
    // messages in flight; each comes back on its database and port.
    let workflows = "SELECT COUNT(*) FROM workflows";
    wait_for(&engine_database, workflows, 30);
    kill(&mut engine);
    let mut engine = pair.start(false, 0);
    wait_for(&engine_database, workflows, 90);
    kill(&mut hr);
    let sent = "SELECT COUNT(*) FROM outbox_messages WHERE status = 'Sent'";
    let sent_at_kill = count(&hr_database, sent).expect("count");
    let mut hr = pair.start(true, hires);

    let deadline = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(status) = hr.try_wait().expect("poll hr") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = hr.kill();
            let _ = engine.kill();
            panic!("not done in 90 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // The engine's last answers are recorded before HR exits; its own
    // outbox may still be acknowledging: wait for it to drain.
    let open = "SELECT COUNT(*) FROM outbox_messages WHERE status <> 'Sent'";
    let drained = Instant::now() + Duration::from_secs(30);
    while count(&engine_database, open).unwrap_or(1) > 0 && Instant::now() < drained {
        std::thread::sleep(Duration::from_millis(50));
    }
    kill(&mut engine);
    assert!(status.success(), "hr-service failed: {status}");
    assert!(
        sent_at_kill < i64::from(hires),
        "HR was killed mid-stream ({sent_at_kill} of {hires} sent)"
    );

    let verdict = verdict_of(&hr_database, &engine_database, dir.path()).expect("verdict");
    assert_eq!(verdict.hires, i64::from(hires), "{verdict:?}");
    assert!(verdict.ok(), "{verdict:?}");
    assert_eq!(count(&hr_database, sent).expect("count"), i64::from(hires));
}
