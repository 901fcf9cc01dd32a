//! Faults between the services: lost acknowledgements and duplicate storms
//! (`lost-acks`, through the proxy), a handler slower than the sender's
//! timeout (`slow-handler`), and an unreachable receiver (`outage`). The
//! services' processes and files are never touched.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::ensure;
use rand::Rng as _;
use rand::rngs::StdRng;

use super::super::Context;
use super::super::cluster::Cluster;
use super::super::proxy::{Proxy, ProxyState, upstream};
use super::super::report::Report;

/// Lost acknowledgements both ways (`drop_answer` of the answers never reach
/// the sender) and a duplicate storm (`replay` of the requests come again).
pub(crate) async fn lost_acks(
    context: &Context,
    rng: &mut StdRng,
    drop_answer: f64,
    replay: f64,
) -> anyhow::Result<Report> {
    let mut cluster = Cluster::new(context)?;
    let to_engine = Proxy::start(
        upstream(cluster.engine_port),
        drop_answer,
        replay,
        rng.random::<u64>(),
    )
    .await?;
    let to_hr = Proxy::start(
        upstream(cluster.hr_port),
        drop_answer,
        replay,
        rng.random::<u64>(),
    )
    .await?;
    cluster.hr_peer = to_engine.url();
    cluster.engine_peer = to_hr.url();
    cluster.start_engine()?;
    cluster.start_hr()?;
    let drained_in = cluster.wait_drained(context.drain_timeout).await?;
    // Let the last replays land before counting.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let verdict = cluster.verdict()?;
    cluster.stop();
    let both =
        |counter: fn(&ProxyState) -> &AtomicU64| to_engine.count(counter) + to_hr.count(counter);
    let dropped = both(|s| &s.dropped_answers);
    let replayed = both(|s| &s.replays);
    let requests = both(|s| &s.requests);
    Ok(Report {
        messages: context.messages,
        faults: dropped + replayed,
        verdict,
        drained_in,
        notes: vec![format!(
            "requests={requests} answers_lost={dropped} replayed={replayed} ({:.0}%/{:.0}%)",
            drop_answer * 100.0,
            replay * 100.0
        )],
    })
}

/// One hire in ten (at most 20 in a run) takes 1.5 s, longer than the
/// sender's 1 s timeout: the sender gives up, the receiver still commits,
/// and the retry is answered from the inbox.
pub(crate) async fn slow_handler(context: &Context) -> anyhow::Result<Report> {
    let mut cluster = Cluster::new(context)?;
    let every = (context.messages / 20).max(10);
    // HR gives up on a request after 1 s (the environment overlay wins over
    // the config file), before the 1.5 s handler is done.
    cluster.hr_env = vec![("RFIDL_OUTBOX_REQUEST_TIMEOUT".into(), "1s".into())];
    cluster.engine_flags = vec![
        "--slow-handler".into(),
        "1500ms".into(),
        "--slow-every".into(),
        every.to_string(),
    ];
    cluster.start_engine()?;
    cluster.start_hr()?;
    let drained_in = cluster.wait_drained(context.drain_timeout).await?;
    let verdict = cluster.verdict()?;
    cluster.stop();
    Ok(Report {
        messages: context.messages,
        faults: u64::from(context.messages.div_ceil(every)),
        verdict,
        drained_in,
        notes: vec![format!("slow=1.5s/{every} timeout=1s")],
    })
}

/// The engine is unreachable for `--outage` (connections refused by the
/// proxy in front of it), then back: reports HR's request rate during the
/// outage and how long the drain took once it was over.
pub(crate) async fn outage(context: &Context, rng: &mut StdRng) -> anyhow::Result<Report> {
    let mut cluster = Cluster::new(context)?;
    let front = Proxy::start(upstream(cluster.engine_port), 0.0, 0.0, rng.random::<u64>()).await?;
    cluster.hr_peer = front.url();
    cluster.hire_rate = (context.messages / 4).max(1);
    cluster.start_engine()?;
    cluster.start_hr()?;
    // Down after a quarter of the hires; HR keeps hiring.
    let quarter = i64::from(context.messages / 4);
    let started = Instant::now();
    while Cluster::count(&cluster.hr_db, "SELECT COUNT(*) FROM employees") < quarter {
        ensure!(
            started.elapsed() < Duration::from_secs(30),
            "HR does not hire"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    front.state.down.store(true, Ordering::SeqCst);
    let before = front.count(|s| &s.refused);
    tokio::time::sleep(context.outage).await;
    cluster.check_alive()?;
    let attempts = front.count(|s| &s.refused) - before;
    let waiting = Cluster::count(
        &cluster.hr_db,
        "SELECT COUNT(*) FROM outbox_messages WHERE status IN ('Pending', 'Sending')",
    );
    let failed_during = Cluster::count(
        &cluster.hr_db,
        "SELECT COUNT(*) FROM outbox_messages WHERE status IN ('Failed', 'DeadLetter', 'Expired')",
    );
    front.state.down.store(false, Ordering::SeqCst);
    let drained_in = cluster.wait_drained(context.drain_timeout).await?;
    let verdict = cluster.verdict()?;
    cluster.stop();
    Ok(Report {
        messages: context.messages,
        faults: 1,
        verdict,
        drained_in,
        notes: vec![format!(
            "outage={}s waiting_at_end={waiting} failed_during={failed_during} \
             requests_during_outage={attempts} ({:.2}/s)",
            context.outage.as_secs(),
            attempts as f64 / context.outage.as_secs_f64()
        )],
    })
}
