//! Preferred leader elections on demand (ElectLeaders, `kiln cluster elect-leaders`): each
//! named partition's leadership goes to its preferred replica now, by the same handover the
//! leader balance makes on its own (`rebalance.rs`, kiln-raft `Liveness::hand_over`).
//!
//! Only a partition's leader can hand it over, and the broker a client asks may not even hold
//! a replica of it. So that broker asks every broker, itself included, with the whole list
//! (a `Forward` frame addressed to [`ELECT_GROUP`]); each one answers for the partitions it
//! leads, after their handovers have ended or the wait has run out, and the answers are merged.
//! A partition no broker claims has no leader at the moment (an election under way, or its
//! leader unreachable from here).
//!
//! Per partition, on its leader:
//! - the leader is the preferred replica: nothing to do ([`Election::NotNeeded`]);
//! - the preferred replica is not in sync, or has not acknowledged the leader within its
//!   lease, for [`READY_WAIT`]: refused ([`Election::PreferredNotReady`]); a handover to a
//!   replica that could not take over would only pause the partition;
//! - otherwise the handover starts (or one already under way is waited for), and the answer
//!   is [`Election::Elected`] once this replica names the preferred one as its leader.
//!   At most `leader_handovers_max` run at once per broker, as for the balance.
//!
//! A handover can end with another follower elected (on a loaded machine its election timeout
//! can pass before the preferred replica's) or be given up ([`Election::HandoverFailed`]), and
//! a partition can be between leaders when asked ([`Election::NoLeader`]). Those are asked
//! again, of whoever leads them then, up to [`ELECT_ROUNDS_MAX`] rounds in all while the wait
//! lasts.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::replica::Replica;
use super::Cluster;

/// The `Forward` frame's group name for elections (no Raft group has this name).
pub(super) const ELECT_GROUP: &str = "__elect_leaders";
/// Partitions one forwarded ask names. An answer carries one outcome (a short text at most)
/// per partition and must fit a control frame (1 MiB; kiln-raft `CONTROL_FRAME_BYTES`).
const PARTITIONS_PER_ASK_MAX: usize = 2_000;
/// Longest a request waits for its handovers, whatever the client's timeout says.
pub const ELECT_WAIT_MAX: Duration = Duration::from_secs(60);
/// Extra time a forwarded ask may take beyond its wait (the transport and the merge).
const FORWARD_SLACK: Duration = Duration::from_secs(5);
/// How long a leader looks for its preferred replica to be in sync before refusing.
const READY_WAIT: Duration = Duration::from_secs(3);
/// How often a leader looks whether its preferred replica is ready, or its handover has ended.
const HANDOVER_POLL: Duration = Duration::from_millis(50);
/// Rounds of asks per request: the first, and retries of partitions whose handover ended
/// without the preferred replica leading or that had no leader when asked.
const ELECT_ROUNDS_MAX: usize = 3;
/// Pause before a retry round, so that a new leader's election settles.
const RETRY_PAUSE: Duration = Duration::from_millis(500);

/// What became of one partition's election.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Election {
    /// The preferred replica leads now.
    Elected,
    /// The preferred replica already led.
    NotNeeded,
    /// No such topic or partition.
    UnknownPartition,
    /// No broker that answered leads it (an election under way, or its leader unreachable).
    NoLeader(String),
    /// The preferred replica cannot take over now; why.
    PreferredNotReady(String),
    /// The handover ended without the preferred replica leading (another was elected, or it
    /// was given up); what happened. Asked again while rounds and time remain.
    HandoverFailed(String),
    /// The handover did not end within the wait.
    TimedOut(String),
}

impl Election {
    /// Which of two brokers' answers for one partition stands: the leader's is the one that
    /// counts, and during a handover both the old and the new leader may claim it.
    fn rank(&self) -> u8 {
        match self {
            Election::Elected => 5,
            Election::NotNeeded => 4,
            Election::TimedOut(_) => 3,
            Election::PreferredNotReady(_) | Election::HandoverFailed(_) => 2,
            Election::NoLeader(_) => 1,
            Election::UnknownPartition => 0,
        }
    }

    /// Worth asking again, of whoever leads the partition then.
    fn retriable(&self) -> bool {
        matches!(self, Election::HandoverFailed(_) | Election::NoLeader(_))
    }
}

/// A forwarded ask: the partitions, and how long the handovers may take.
#[derive(Debug, Serialize, Deserialize)]
struct Ask {
    partitions: Vec<(String, i32)>,
    wait_ms: u64,
}

/// One broker's answer: (index into the ask's partitions, outcome) for those it leads.
type Answer = Vec<(u32, Election)>;

impl Cluster {
    /// Elects each of `wanted`'s preferred replica (see the module doc); one outcome per
    /// partition, in order. Waits at most `wait` (capped at [`ELECT_WAIT_MAX`]).
    pub async fn elect_preferred(
        self: &Arc<Self>,
        wanted: &[(String, i32)],
        wait: Duration,
    ) -> Vec<Election> {
        let deadline = Instant::now() + wait.min(ELECT_WAIT_MAX);
        let mut out: Vec<Election> = wanted
            .iter()
            .map(|(topic, index)| match self.topic(topic) {
                Some(t) if (0..t.partition_count()).contains(index) => {
                    Election::NoLeader(String::new())
                }
                _ => Election::UnknownPartition,
            })
            .collect();
        let mut pending: Vec<usize> = (0..wanted.len())
            .filter(|&i| out[i] != Election::UnknownPartition)
            .collect();
        for round in 0..ELECT_ROUNDS_MAX {
            if round > 0 {
                if pending.is_empty() || Instant::now() + RETRY_PAUSE >= deadline {
                    break;
                }
                tracing::info!(
                    partitions = pending.len(),
                    round,
                    "asking again for partitions whose preferred replica was not elected"
                );
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            for chunk in pending.chunks(PARTITIONS_PER_ASK_MAX) {
                self.elect_chunk(wanted, chunk, deadline, &mut out).await;
            }
            pending.retain(|&i| out[i].retriable());
        }
        out
    }

    /// One ask of every broker for the partitions `chunk` indexes in `wanted`; their outcomes
    /// go to `out` (replacing those of an earlier round).
    async fn elect_chunk(
        &self,
        wanted: &[(String, i32)],
        chunk: &[usize],
        deadline: Instant,
        out: &mut [Election],
    ) {
        let ask = Ask {
            partitions: chunk.iter().map(|&i| wanted[i].clone()).collect(),
            wait_ms: u64::try_from(
                deadline
                    .saturating_duration_since(Instant::now())
                    .as_millis(),
            )
            .unwrap_or(u64::MAX),
        };
        for &i in chunk {
            out[i] = Election::NoLeader(String::new());
        }
        let (answers, silent) = self.ask_everyone(&ask, deadline).await;
        for (j, election) in answers.into_iter().flatten() {
            let Some(&i) = usize::try_from(j).ok().and_then(|j| chunk.get(j)) else {
                tracing::warn!(
                    index = j,
                    "an election answer names a partition that was not asked"
                );
                continue;
            };
            if election.rank() > out[i].rank() {
                out[i] = election;
            }
        }
        let why = if silent.is_empty() {
            "no broker leads it now (an election is under way)".to_string()
        } else {
            format!(
                "no broker that answered leads it now; {} did not answer",
                silent.join("; ")
            )
        };
        for &i in chunk {
            if let Election::NoLeader(reason) = &mut out[i] {
                reason.clone_from(&why);
            }
        }
    }

    /// Sends `ask` to every broker (this one directly); the answers, and a line for each peer
    /// that did not answer.
    async fn ask_everyone(&self, ask: &Ask, deadline: Instant) -> (Vec<Answer>, Vec<String>) {
        let payload = match serde_json::to_vec(ask) {
            Ok(p) => Bytes::from(p),
            Err(e) => unreachable!("an ask of names and numbers always encodes: {e}"),
        };
        let timeout = deadline.saturating_duration_since(Instant::now()) + FORWARD_SLACK;
        let others: Vec<i32> = self
            .brokers()
            .iter()
            .map(|b| b.id)
            .filter(|id| *id != self.node_id)
            .collect();
        let peers = others.into_iter().map(|peer| {
            let payload = payload.clone();
            async move {
                let answer = self
                    .forward_to(peer, ELECT_GROUP, payload, timeout)
                    .await
                    .and_then(|bytes| {
                        serde_json::from_slice::<Answer>(&bytes)
                            .map_err(|e| format!("an answer that does not parse: {e}"))
                    });
                (peer, answer)
            }
        });
        let (here, there) =
            tokio::join!(self.elect_here(ask), futures_util::future::join_all(peers));
        let mut answers = vec![here];
        let mut silent = Vec::new();
        for (id, answer) in there {
            match answer {
                Ok(a) => answers.push(a),
                Err(e) => silent.push(format!("broker {id} ({e})")),
            }
        }
        (answers, silent)
    }

    /// An ask another broker forwarded: this broker's answer, encoded.
    pub(super) async fn take_elections(&self, payload: &[u8]) -> Result<Bytes, String> {
        let ask: Ask = serde_json::from_slice(payload)
            .map_err(|e| format!("a forwarded election ask that does not parse: {e}"))?;
        if ask.partitions.len() > PARTITIONS_PER_ASK_MAX {
            return Err(format!(
                "an election ask of {} partitions (at most {PARTITIONS_PER_ASK_MAX})",
                ask.partitions.len()
            ));
        }
        let answer = self.elect_here(&ask).await;
        serde_json::to_vec(&answer)
            .map(Bytes::from)
            .map_err(|e| format!("cannot encode the election answer: {e}"))
    }

    /// The elections of the asked partitions this broker leads.
    async fn elect_here(&self, ask: &Ask) -> Answer {
        let wait = Duration::from_millis(ask.wait_ms).min(ELECT_WAIT_MAX);
        let deadline = Instant::now() + wait;
        let led: Vec<(u32, Arc<Replica>)> = ask
            .partitions
            .iter()
            .zip(0u32..)
            .filter_map(|((topic, index), i)| {
                let topic = self.topic(topic)?;
                let replica = self.partition(&topic, *index)?;
                (replica.is_leader() || replica.handing_over()).then_some((i, replica))
            })
            .collect();
        futures_util::stream::iter(led)
            .map(|(i, replica)| async move { (i, elect_one(&replica, deadline).await) })
            .buffer_unordered(self.settings.leader_handovers_max)
            .collect()
            .await
    }
}

/// Hands one partition this broker leads to its preferred replica and waits until it leads.
async fn elect_one(replica: &Replica, deadline: Instant) -> Election {
    let me = replica.node_id;
    let Some(&preferred) = replica.members().first() else {
        unreachable!("a replica's group has members; this broker is one of them");
    };
    if preferred == me {
        return Election::NotNeeded;
    }
    if Instant::now() >= deadline {
        return Election::TimedOut(format!(
            "not started within the request's timeout (broker {me} hands over at most a \
             few partitions at once)"
        ));
    }
    if !replica.handing_over() {
        // Under writes an in-sync follower trails the leader's last applied entry by what is
        // in flight, now and then: look again for a moment before refusing.
        let ready_by = deadline.min(Instant::now() + READY_WAIT);
        let to = loop {
            if let Some(to) = replica.preferred_ready() {
                break to;
            }
            if Instant::now() >= ready_by {
                return Election::PreferredNotReady(format!(
                    "broker {preferred} is not in sync with the leader, broker {me}, or has not \
                     acknowledged it within its lease"
                ));
            }
            tokio::time::sleep(HANDOVER_POLL).await;
        };
        if let Err(e) = replica.partition.hand_over(to) {
            return Election::PreferredNotReady(format!("broker {me} cannot hand over: {e}"));
        }
        tracing::info!(group = %replica.group, to = preferred, "handing over on request");
    }
    loop {
        let leader = replica.leader().0;
        if leader == preferred {
            return Election::Elected;
        }
        if !replica.handing_over() && replica.is_leader() {
            return Election::HandoverFailed(format!(
                "broker {preferred} was not elected; the handover was given up and broker {me} \
                 leads again"
            ));
        }
        if leader >= 0 && leader != me {
            return Election::HandoverFailed(format!(
                "broker {leader} was elected instead of broker {preferred}"
            ));
        }
        if Instant::now() >= deadline {
            return Election::TimedOut(format!(
                "broker {preferred} did not lead within the request's timeout"
            ));
        }
        tokio::time::sleep(HANDOVER_POLL).await;
    }
}
