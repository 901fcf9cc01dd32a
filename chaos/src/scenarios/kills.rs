//! SIGKILLs at random moments of the sender, the receiver or both, each
//! followed by a restart on the same files and ports; and the kill loop the
//! JetStream scenario reuses. It never kills anything but the cluster's
//! own children.

use std::time::Duration;

use rand::Rng as _;
use rand::rngs::StdRng;

use super::super::Context;
use super::super::cluster::{Cluster, wait_listening};
use super::super::report::Report;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    Sender,
    Receiver,
    Both,
}

/// SIGKILLs at random moments (while HR is still hiring, while the engine
/// is inside a handler), each followed by a restart on the same files and
/// ports.
pub(crate) async fn kills(
    context: &Context,
    rng: &mut StdRng,
    target: Target,
) -> anyhow::Result<Report> {
    let mut cluster = Cluster::new(context)?;
    // Hiring spans the first kills (about 2 s of hires, longer with the
    // restarts), then the kills go on through delivery.
    cluster.hire_rate = (context.messages / 2).max(1);
    cluster.engine_flags = kill_slow_handlers(context.messages);
    cluster.start_engine()?;
    cluster.start_hr()?;
    wait_listening(cluster.engine_port, Duration::from_secs(10)).await?;
    let victims = |round: u32| match target {
        Target::Sender => vec![Target::Sender],
        Target::Receiver => vec![Target::Receiver],
        // Interleaved: alternate, and sometimes both at once.
        Target::Both => match round % 3 {
            0 => vec![Target::Sender],
            1 => vec![Target::Receiver],
            _ => vec![Target::Sender, Target::Receiver],
        },
    };
    let mut killed_while_hiring = 0;
    let faults = kill_rounds(
        &mut cluster,
        rng,
        context.kills,
        Cluster::check_alive,
        |cluster, round| {
            let victims = victims(round);
            for victim in &victims {
                match victim {
                    Target::Sender => {
                        let hired =
                            Cluster::count(&cluster.hr_db, "SELECT COUNT(*) FROM employees");
                        if hired < i64::from(context.messages) {
                            killed_while_hiring += 1;
                        }
                        cluster.kill_hr();
                    }
                    _ => cluster.kill_engine(),
                }
            }
            victims.len() as u64
        },
        |cluster, round| {
            for victim in &victims(round) {
                match victim {
                    Target::Sender => cluster.start_hr()?,
                    _ => cluster.start_engine()?,
                }
            }
            Ok(())
        },
    )
    .await?;
    let drained_in = cluster.wait_drained(context.drain_timeout).await?;
    let verdict = cluster.verdict()?;
    cluster.stop();
    let mut notes = Vec::new();
    if target != Target::Receiver {
        notes.push(format!("killed_while_hiring={killed_while_hiring}"));
    }
    Ok(Report {
        messages: context.messages,
        faults,
        verdict,
        drained_in,
        notes,
    })
}

/// The engine's flags in the kill scenarios: 2 ms handlers (every one in a
/// small run of `messages`, one in 50 in a run of 100,000), so that a kill
/// of the engine often lands inside one.
pub(crate) fn kill_slow_handlers(messages: u32) -> Vec<String> {
    let every = (messages / 2000).max(1);
    vec![
        "--slow-handler".into(),
        "2ms".into(),
        "--slow-every".into(),
        every.to_string(),
    ]
}

/// The loop of the kill scenarios, on `state` (what they kill and
/// restart): `rounds` times, a random pause (50-400 ms), `alive` (fails
/// when a process exited on its own), `kill(round)` (which returns how many
/// processes it killed), a random pause (0-200 ms), then `restart(round)`
/// on the same files. Returns the kills.
pub(crate) async fn kill_rounds<S>(
    state: &mut S,
    rng: &mut StdRng,
    rounds: u32,
    alive: impl Fn(&mut S) -> anyhow::Result<()>,
    mut kill: impl FnMut(&mut S, u32) -> u64,
    mut restart: impl FnMut(&mut S, u32) -> anyhow::Result<()>,
) -> anyhow::Result<u64> {
    let mut faults = 0;
    for round in 0..rounds {
        tokio::time::sleep(Duration::from_millis(rng.random_range(50..400))).await;
        alive(state)?;
        faults += kill(state, round);
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..200))).await;
        restart(state, round)?;
    }
    Ok(faults)
}
