//! The peers benchmark's broker pass (issue 31): rfidl's exactly-once
//! rate over a broker beside the same broker used directly, at least once,
//! in the same run, on the same broker:
//!
//! * AMQP 1.0 on a throw-away RabbitMQ node (its `rabbitmq_amqp1_0`
//!   plugin; started here as the runtime's tests start theirs, from
//!   `RFIDL_RABBITMQ_SERVER` or Debian's `/usr/sbin/rabbitmq-server`):
//!   raw is fe2o3-amqp publishing durable messages to a durable queue
//!   (each settled on the broker's `accepted`, a bounded window of them
//!   outstanding) while a receiver link takes and accepts each;
//! * JetStream on a 3-node `nats-server` cluster (`RFIDL_NATS_SERVER`),
//!   streams of 3 replicas, then on one server (default fsync policy),
//!   streams of one: raw is async-nats publishing with `Nats-Msg-Id` (a
//!   bounded window of outstanding publish acks) while a durable pull
//!   consumer double-acks each (the same raw client as the peers rows
//!   above).
//!
//! rfidl is (c) over [`Wire::Amqp`], [`Wire::JetStreamR3`] and
//! [`Wire::JetStream`]: a committed
//! backlog, dispatched, each message published (its row `Sent` on the
//! broker's acknowledgement), consumed into the receiver (`FULL`, one
//! ledger row per message in the inbox transaction) and acknowledged after
//! the commit; the figure ends when every effect is committed. Raw and
//! rfidl alternate, [`ROUNDS`] rounds each, each round on a queue or
//! stream of its own; the medians are compared.
//!
//! Beside each round's rate, the CPU it took per message: this process's
//! (the raw clients, or all of rfidl: dispatcher, consumer, receiver) and
//! the broker's processes' (from `/proc`): on a shared 2-core machine the
//! rates move with other work, the CPU per message much less.
//!
//! Both brokers are started with the runtime's test support
//! (`tests/it/support/`), included here by path.
//!
//! For diagnosis: `RFIDL_BENCH_ONLY=brokers` runs this pass alone,
//! `RFIDL_BENCH_BROKER=amqp|jetstream` one broker (`jetstream-r3` or
//! `jetstream-r1`: one of its two passes), `RFIDL_BENCH_ROUNDS=N`
//! N rounds, `RFIDL_BENCH_CONCURRENCY=N` the consumers' concurrency,
//! `RFIDL_BENCH_TRACE=1` (c)'s progress every half second, `RUST_LOG` the
//! runtime's logs.

use std::collections::{HashSet, VecDeque};
use std::path::Path;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use fe2o3_amqp::link::CreditMode;
use fe2o3_amqp::types::messaging::{Body, Header, Message, MessageId, Outcome, Properties};
use fe2o3_amqp::types::primitives::{Binary, Value};
use futures_util::StreamExt;
use rfidl_runtime::config::Durability;

use super::{MESSAGES, Phases, payloads};
use crate::common::{
    DELIVERIES, Fsync, NatsServer, Wire, delivery_run, rate, report, sized_message,
};

#[allow(dead_code)]
#[path = "../../tests/it/support/nats.rs"]
mod nats_support;
#[allow(dead_code)]
#[path = "../../tests/it/support/amqp.rs"]
mod rabbit;

/// Raw and rfidl runs per broker, alternating.
pub const ROUNDS: usize = 3;

/// [`ROUNDS`], or `RFIDL_BENCH_ROUNDS`.
fn round_count() -> usize {
    std::env::var("RFIDL_BENCH_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(ROUNDS)
        .max(1)
}
/// Publishes (raw) whose acknowledgement may be outstanding at once.
const PUBLISH_WINDOW: usize = 256;
/// The raw AMQP receiver's link credit.
const CREDIT: u32 = 256;
/// The raw JetStream consumer's double acks awaiting confirmation at once.
const ACK_WINDOW: usize = 256;

/// One broker's rounds: (raw, rfidl) rates in msg/s, and the CPU each
/// round took per message (this process, the broker's processes), in µs.
pub struct Rounds {
    pub broker: &'static str,
    pub raw: Vec<f64>,
    pub rfidl: Vec<f64>,
    pub raw_cpu: Vec<(f64, f64)>,
    pub rfidl_cpu: Vec<(f64, f64)>,
}

impl Rounds {
    pub fn raw_median(&self) -> f64 {
        median(&self.raw)
    }
    pub fn rfidl_median(&self) -> f64 {
        median(&self.rfidl)
    }
}

fn median(rates: &[f64]) -> f64 {
    let mut sorted = rates.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

/// Runs both brokers' rounds and prints their rows; a broker that cannot
/// be started here is skipped, loudly.
pub fn run(runtime: &tokio::runtime::Runtime, dir: &Path) -> Vec<Rounds> {
    let mut all = Vec::new();
    let only = std::env::var("RFIDL_BENCH_BROKER").unwrap_or_default();
    match (only.is_empty() || only == "amqp")
        .then(rabbit::RabbitNode::start)
        .flatten()
    {
        Some(node) => {
            let base: &'static str = format!("amqp://guest:guest@127.0.0.1:{}", node.port()).leak();
            let mut rounds = Rounds {
                broker: "AMQP 1.0 (RabbitMQ)",
                raw: Vec::new(),
                rfidl: Vec::new(),
                raw_cpu: Vec::new(),
                rfidl_cpu: Vec::new(),
            };
            for round in 0..round_count() {
                let queue = format!("raw-{round}");
                let cpu = Cpu::now();
                let raw = runtime.block_on(amqp_raw(node.port(), &queue));
                rounds.raw_cpu.push(cpu.per_message());
                // Every message accepted: the queue empties (the last
                // accepts may take the broker a moment).
                let deadline = Instant::now() + Duration::from_secs(10);
                while node.queue_depth(&queue) != Some((0, 0)) {
                    assert!(
                        Instant::now() < deadline,
                        "raw AMQP: messages left in the queue: {:?}",
                        node.queue_depth(&queue)
                    );
                    std::thread::sleep(Duration::from_millis(100));
                }
                eprintln!("raw AMQP round {round}: {:?}", raw.total);
                rounds.raw.push(rate(MESSAGES, raw.total));
                let cpu = Cpu::now();
                let rfidl = rfidl_rate(runtime, dir, Wire::Amqp(base));
                rounds.rfidl_cpu.push(cpu.per_message());
                eprintln!("rfidl AMQP round {round}: {rfidl:.0} msg/s");
                rounds.rfidl.push(rfidl);
            }
            print_rounds(&rounds);
            all.push(rounds);
            drop(node);
        }
        None if only.is_empty() || only == "amqp" => {
            println!("(AMQP skipped: no rabbitmq-server)")
        }
        None => {}
    }
    let r3 = only.is_empty() || only == "jetstream" || only == "jetstream-r3";
    let r1 = only.is_empty() || only == "jetstream" || only == "jetstream-r1";
    match r3.then(nats_support::NatsCluster::start).flatten() {
        Some(cluster) => {
            let ports = cluster.ports();
            let servers: &'static str = ports
                .iter()
                .map(|port| format!("127.0.0.1:{port}"))
                .collect::<Vec<_>>()
                .join(",")
                .leak();
            let seeds: Vec<String> = ports
                .iter()
                .map(|port| format!("nats://127.0.0.1:{port}"))
                .collect();
            let rounds = jetstream_rounds(
                runtime,
                dir,
                "JetStream R3 (3-node cluster)",
                &seeds,
                3,
                Wire::JetStreamR3(format!("nats://{servers}").leak()),
            );
            print_rounds(&rounds);
            all.push(rounds);
            drop(cluster);
        }
        None if r3 => {
            println!("(JetStream R3 skipped: RFIDL_NATS_SERVER is not set)")
        }
        None => {}
    }
    // The first comparison, under the same conditions: one server
    // (default fsync policy), streams of one replica.
    match std::env::var_os("RFIDL_NATS_SERVER").filter(|_| r1) {
        Some(binary) => {
            let server = NatsServer::start(Path::new(&binary), dir, Fsync::Default);
            let rounds = jetstream_rounds(
                runtime,
                dir,
                "JetStream R1 (1 node)",
                std::slice::from_ref(&server.url),
                1,
                Wire::JetStream(server.url.clone().leak()),
            );
            print_rounds(&rounds);
            all.push(rounds);
            drop(server);
        }
        None if r1 => {
            println!("(JetStream R1 skipped: RFIDL_NATS_SERVER is not set)")
        }
        None => {}
    }
    all
}

/// Raw JetStream and rfidl over `wire`, alternating, on the servers
/// `seeds`, streams of `replicas`.
fn jetstream_rounds(
    runtime: &tokio::runtime::Runtime,
    dir: &Path,
    broker: &'static str,
    seeds: &[String],
    replicas: usize,
    wire: Wire,
) -> Rounds {
    let mut rounds = Rounds {
        broker,
        raw: Vec::new(),
        rfidl: Vec::new(),
        raw_cpu: Vec::new(),
        rfidl_cpu: Vec::new(),
    };
    for round in 0..round_count() {
        let cpu = Cpu::now();
        let raw = runtime.block_on(jetstream_raw(
            seeds.to_vec(),
            replicas,
            &format!("RAW{replicas}X{round}"),
        ));
        rounds.raw_cpu.push(cpu.per_message());
        eprintln!("raw {broker} round {round}: {:?}", raw.total);
        rounds.raw.push(rate(MESSAGES, raw.total));
        let cpu = Cpu::now();
        let rfidl = rfidl_rate(runtime, dir, wire);
        rounds.rfidl_cpu.push(cpu.per_message());
        eprintln!("rfidl {broker} round {round}: {rfidl:.0} msg/s");
        rounds.rfidl.push(rfidl);
    }
    rounds
}

fn rfidl_rate(runtime: &tokio::runtime::Runtime, dir: &Path, wire: Wire) -> f64 {
    let run = runtime.block_on(delivery_run(dir, Durability::Full, 256, wire, |d, n| {
        sized_message(d, n, super::BYTES)
    }));
    rate(DELIVERIES, run.deliver)
}

fn print_rounds(rounds: &Rounds) {
    let list = |rates: &[f64]| {
        rates
            .iter()
            .map(|r| format!("{r:.0}"))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    report(
        &format!("{}: raw at-least-once, rounds", rounds.broker),
        format!("{} msg/s", list(&rounds.raw)),
    );
    report(
        &format!("{}: rfidl (c) exactly-once, rounds", rounds.broker),
        format!("{} msg/s", list(&rounds.rfidl)),
    );
    let cpu = |cpu: &[(f64, f64)]| {
        cpu.iter()
            .map(|(own, broker)| format!("{own:.0}+{broker:.0}"))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    report(
        &format!("{}: raw CPU µs/msg (client+broker)", rounds.broker),
        cpu(&rounds.raw_cpu),
    );
    report(
        &format!("{}: rfidl CPU µs/msg (rfidl+broker)", rounds.broker),
        cpu(&rounds.rfidl_cpu),
    );
    report(
        &format!("{}: medians raw / rfidl", rounds.broker),
        format!(
            "{:.0} / {:.0} msg/s",
            rounds.raw_median(),
            rounds.rfidl_median()
        ),
    );
    report(
        &format!("{}: rfidl ÷ raw (target ≥ 60 %)", rounds.broker),
        format!(
            "{:.0} %",
            100.0 * rounds.rfidl_median() / rounds.raw_median()
        ),
    );
}

/// CPU time used so far by this process and by every process started
/// under it (the brokers), in clock ticks, from `/proc`.
struct Cpu {
    own: u64,
    children: u64,
}

impl Cpu {
    fn now() -> Cpu {
        let me = std::process::id();
        let stats: Vec<(u32, u32, u64)> = std::fs::read_dir("/proc")
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
                    .filter_map(|pid| {
                        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
                        // After the command's closing parenthesis: state,
                        // ppid, …, utime (14th field), stime (15th).
                        let fields: Vec<&str> =
                            stat.rsplit_once(')')?.1.split_whitespace().collect();
                        let ppid = fields.get(1)?.parse().ok()?;
                        let ticks = fields.get(11)?.parse::<u64>().ok()?
                            + fields.get(12)?.parse::<u64>().ok()?;
                        Some((pid, ppid, ticks))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let mut descendants = vec![me];
        let mut grew = true;
        while grew {
            grew = false;
            for (pid, ppid, _) in &stats {
                if descendants.contains(ppid) && !descendants.contains(pid) {
                    descendants.push(*pid);
                    grew = true;
                }
            }
        }
        let ticks = |pid: u32| {
            stats
                .iter()
                .find(|(p, _, _)| *p == pid)
                .map_or(0, |(_, _, t)| *t)
        };
        Cpu {
            own: ticks(me),
            children: descendants[1..].iter().map(|pid| ticks(*pid)).sum(),
        }
    }

    /// µs of CPU per message since `self`: (this process, its children).
    fn per_message(&self) -> (f64, f64) {
        // USER_HZ: 100 on Linux.
        let now = Cpu::now();
        let per = |ticks: u64| ticks as f64 * 10_000.0 / MESSAGES as f64;
        (
            per(now.own.saturating_sub(self.own)),
            per(now.children.saturating_sub(self.children)),
        )
    }
}

/// AMQP 1.0 directly: every message (durable, its own `message-id`) sent
/// unsettled to `/queue/<queue>` and settled on the broker's `accepted`,
/// at most [`PUBLISH_WINDOW`] outstanding; a receiver link of
/// [`CREDIT`] credit, attached first, accepts each message as it comes.
/// `first` ends at the last `accepted`, `total` at the last accept sent.
pub async fn amqp_raw(port: u16, queue: &str) -> Phases {
    let url = format!("amqp://guest:guest@127.0.0.1:{port}");
    let address = format!("/queue/{queue}");
    let durable = fe2o3_amqp::types::messaging::TerminusDurability::Configuration;

    let mut in_connection = fe2o3_amqp::Connection::open(format!("raw-in-{queue}"), url.as_str())
        .await
        .expect("connect");
    let mut in_session = fe2o3_amqp::Session::begin(&mut in_connection)
        .await
        .expect("session");
    let mut receiver = fe2o3_amqp::Receiver::builder()
        .name(format!("raw-in-{queue}"))
        .source(
            fe2o3_amqp::types::messaging::Source::builder()
                .address(address.clone())
                .durable(durable.clone())
                .build(),
        )
        .credit_mode(CreditMode::Auto(CREDIT))
        .auto_accept(false)
        .attach(&mut in_session)
        .await
        .expect("attach a receiver");
    let consuming = tokio::spawn(async move {
        let mut seen = HashSet::with_capacity(MESSAGES);
        while seen.len() < MESSAGES {
            let delivery = receiver.recv::<Body<Value>>().await.expect("recv");
            let id = match delivery
                .message()
                .properties
                .as_ref()
                .and_then(|p| p.message_id.clone())
            {
                Some(MessageId::String(id)) => id,
                other => panic!("message id {other:?}"),
            };
            assert!(seen.insert(id), "a message came twice");
            receiver.accept(&delivery).await.expect("accept");
        }
        let done = Instant::now();
        let _ = receiver.close().await;
        let _ = in_session.end().await;
        let _ = in_connection.close().await;
        done
    });

    let mut out_connection = fe2o3_amqp::Connection::open(format!("raw-out-{queue}"), url.as_str())
        .await
        .expect("connect");
    let mut out_session = fe2o3_amqp::Session::begin(&mut out_connection)
        .await
        .expect("session");
    let mut sender = fe2o3_amqp::Sender::builder()
        .name(format!("raw-out-{queue}"))
        .target(
            fe2o3_amqp::types::messaging::Target::builder()
                .address(address)
                .durable(durable)
                .build(),
        )
        .attach(&mut out_session)
        .await
        .expect("attach a sender");
    let payloads = payloads();
    let accepted = |outcome: Result<Outcome, fe2o3_amqp::link::SendError>| {
        assert!(
            matches!(outcome.expect("disposition"), Outcome::Accepted(_)),
            "not accepted"
        );
    };
    let started = Instant::now();
    let mut pending = VecDeque::with_capacity(PUBLISH_WINDOW);
    for (n, body) in payloads.into_iter().enumerate() {
        if pending.len() >= PUBLISH_WINDOW {
            let future: fe2o3_amqp::link::delivery::DeliveryFut<_> =
                pending.pop_front().expect("pending");
            accepted(future.await);
        }
        let message = Message::builder()
            .header(Header {
                durable: true,
                ..Header::default()
            })
            .properties(
                Properties::builder()
                    .message_id(format!("order-{n}"))
                    .build(),
            )
            .data(Binary::from(body))
            .build();
        pending.push_back(sender.send_batchable(message).await.expect("send"));
    }
    for future in pending {
        accepted(future.await);
    }
    let published = started.elapsed();
    let last = consuming.await.expect("consumer");
    let _ = sender.close().await;
    let _ = out_session.end().await;
    let _ = out_connection.close().await;
    Phases {
        first: published,
        total: last.duration_since(started),
    }
}

/// JetStream directly, on the servers `seeds` (one cluster): a file
/// stream `name` of `replicas` replicas, every message published with its
/// `Nats-Msg-Id` (at most [`PUBLISH_WINDOW`] publish acks outstanding)
/// while a durable pull consumer double-acks each (at most
/// [`ACK_WINDOW`] awaiting the server's confirmation). `first` ends at
/// the last publish ack, `total` at the last confirmed double ack.
/// Creating the stream is retried while the cluster elects its leaders.
pub async fn jetstream_raw(seeds: Vec<String>, replicas: usize, name: &str) -> Phases {
    let client = async_nats::connect(seeds).await.expect("connect");
    let js = jetstream::new(client);
    let subject = format!("peers.{}", name.to_lowercase());
    let deadline = Instant::now() + Duration::from_secs(60);
    let stream = loop {
        let created = js
            .create_stream(jetstream::stream::Config {
                name: name.into(),
                subjects: vec![subject.clone()],
                storage: jetstream::stream::StorageType::File,
                duplicate_window: Duration::from_secs(120),
                num_replicas: replicas,
                ..Default::default()
            })
            .await;
        match created {
            Ok(stream) => break stream,
            Err(error) => {
                assert!(Instant::now() < deadline, "stream {name}: {error}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let consumer = stream
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some("ledger".into()),
            ack_policy: jetstream::consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await
        .expect("consumer");
    let payloads = payloads();

    let consuming = tokio::spawn(async move {
        let mut messages = consumer
            .stream()
            .max_messages_per_batch(500)
            .messages()
            .await
            .expect("messages");
        let mut seen = HashSet::with_capacity(MESSAGES);
        let mut acks = tokio::task::JoinSet::<Result<(), String>>::new();
        while seen.len() < MESSAGES {
            while acks.len() >= ACK_WINDOW {
                acks.join_next()
                    .await
                    .expect("an ack")
                    .expect("ack task")
                    .expect("double ack");
            }
            let message = messages
                .next()
                .await
                .expect("the stream ended")
                .expect("message");
            let id = message
                .headers
                .as_ref()
                .and_then(|h| h.get("Nats-Msg-Id"))
                .map(|v| v.as_str().to_owned())
                .expect("Nats-Msg-Id");
            assert!(seen.insert(id), "a message came twice");
            acks.spawn(async move { message.double_ack().await.map_err(|e| e.to_string()) });
        }
        while let Some(done) = acks.join_next().await {
            done.expect("ack task").expect("double ack");
        }
        Instant::now()
    });

    let started = Instant::now();
    let mut pending: VecDeque<jetstream::context::PublishAckFuture> =
        VecDeque::with_capacity(PUBLISH_WINDOW);
    for (n, body) in payloads.into_iter().enumerate() {
        if pending.len() >= PUBLISH_WINDOW {
            let ack: jetstream::publish::PublishAck = pending
                .pop_front()
                .expect("pending")
                .await
                .expect("publish ack");
            assert!(!ack.duplicate);
        }
        let publish = jetstream::message::PublishMessage::build()
            .payload(body.into())
            .message_id(format!("order-{n}"));
        pending.push_back(
            js.send_publish(subject.clone(), publish)
                .await
                .expect("publish"),
        );
    }
    for ack in pending {
        assert!(!ack.await.expect("publish ack").duplicate);
    }
    let published = started.elapsed();
    let last_ack = consuming.await.expect("consumer");
    let total = last_ack.duration_since(started);

    // De-duplication is on: publishing message 0 again is recognised.
    let again = jetstream::message::PublishMessage::build()
        .payload(b"again".to_vec().into())
        .message_id("order-0");
    let ack = js
        .send_publish(subject, again)
        .await
        .expect("publish")
        .await
        .expect("publish ack");
    assert!(ack.duplicate, "the stream did not de-duplicate");
    let mut stream = stream;
    let info = stream.info().await.expect("stream info");
    assert_eq!(info.state.messages as usize, MESSAGES);
    Phases {
        first: published,
        total,
    }
}
