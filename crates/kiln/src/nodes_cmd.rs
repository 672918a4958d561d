//! `kiln nodes show HOST` (a node's state, runs, checks and events from the store) and the
//! dead-letter workflow: `kiln dlq list [--action A]` (dead-lettered nodes with the action and
//! findings of their last attempt, as the dashboard lists them), `kiln dlq resolve HOST --note`
//! (what was done, kept in the node's history and the triage record, then the node's next
//! cycle) and `kiln dlq requeue HOST` (the next cycle without a note).

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use kiln_findings::Action;
use kiln_queue::{now_ms, NodeMessage, NodeProducer, ProducerConfig};
use kiln_store::{CheckVerdict, NodeHistory, NodeState, QueuedNode, Store};

use crate::platform_args::{PlatformArgs, StoreArgs};

#[derive(Args, Debug)]
pub struct NodesArgs {
    #[command(flatten)]
    store: StoreArgs,
    #[command(subcommand)]
    command: NodesCommand,
}

#[derive(Subcommand, Debug)]
enum NodesCommand {
    /// A node's state and why, its runs with their failing checks, and its state changes.
    Show {
        hostname: String,
        /// Print the whole history as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args, Debug)]
pub struct DlqArgs {
    #[command(flatten)]
    platform: PlatformArgs,
    #[command(subcommand)]
    command: DlqCommand,
}

#[derive(Subcommand, Debug)]
enum DlqCommand {
    /// Queue a dead-lettered node again (after repair) as its next cycle, attempts from 1.
    Requeue { hostname: String },
    /// Dead-lettered nodes, newest first, with the action and findings of their last attempt.
    List {
        /// Only nodes whose action is this (rma, reset_gpu, reboot, reflash_firmware,
        /// reseat_cable, config, cooling, investigate).
        #[arg(long)]
        action: Option<String>,
        /// Nodes listed at most.
        #[arg(long, default_value_t = 500)]
        limit: u32,
    },
    /// Record what was done to a dead-lettered node (kept in its history and shown in the next
    /// report), then queue it again as its next cycle.
    Resolve {
        hostname: String,
        /// What was done: "GPU 3 replaced, RMA 12345".
        #[arg(long)]
        note: String,
        /// Who did it (default: $USER).
        #[arg(long)]
        by: Option<String>,
    },
}

/// Longest resolution note, in characters.
const NOTE_CHARS_MAX: usize = 1000;

pub async fn run_nodes(args: NodesArgs) -> anyhow::Result<()> {
    let NodesCommand::Show { hostname, json } = &args.command;
    let store = Store::connect(&args.store.database_url).await?;
    let history = store.node_history(hostname).await?;
    store.close().await;
    let Some(h) = history else {
        bail!("no node {hostname:?} in the store");
    };
    if *json {
        println!("{}", serde_json::to_string_pretty(&h)?);
        return Ok(());
    }
    let n = &h.node;
    println!(
        "{}  rack {}  {}  (cycle {}, attempt {})\n  why: {}",
        n.spec.hostname, n.spec.rack, n.state, n.cycle, n.attempt, n.state_reason
    );
    println!("runs:");
    for r in &h.runs {
        let verdict = r.verdict.map(|v| v.as_str()).unwrap_or("unfinished");
        println!(
            "  cycle {} attempt {:>2}  {:<10}  agent {}",
            r.cycle, r.attempt, verdict, r.agent
        );
        for c in r
            .checks
            .iter()
            .filter(|c| !matches!(c.verdict, CheckVerdict::Pass | CheckVerdict::Skip))
        {
            println!("      {} {}: {}", c.verdict.as_str(), c.name, c.message);
        }
    }
    println!("events:");
    for e in &h.events {
        println!(
            "  {}  cycle {} attempt {:>2}  {:<13}  {}",
            e.at_ms, e.cycle, e.attempt, e.state, e.reason
        );
    }
    Ok(())
}

pub async fn run_dlq(args: DlqArgs) -> anyhow::Result<()> {
    match &args.command {
        DlqCommand::Requeue { hostname } => {
            let store = Store::connect(&args.platform.store.database_url).await?;
            let h = dead_lettered(&store, hostname).await?;
            let done = requeue(&store, &args, h).await;
            store.close().await;
            println!("{}", done?);
            Ok(())
        }
        DlqCommand::List { action, limit } => list(&args, action.as_deref(), *limit).await,
        DlqCommand::Resolve { hostname, note, by } => {
            resolve(&args, hostname, note, by.as_deref()).await
        }
    }
}

/// The node's history, if it is dead-lettered; a clear error otherwise.
async fn dead_lettered(store: &Store, hostname: &str) -> anyhow::Result<NodeHistory> {
    let Some(h) = store.node_history(hostname).await? else {
        bail!("no node {hostname:?} in the store");
    };
    if h.node.state != NodeState::DeadLettered {
        bail!(
            "{hostname} is {} (cycle {}, attempt {}), not dead_lettered",
            h.node.state,
            h.node.cycle,
            h.node.attempt
        );
    }
    Ok(h)
}

async fn list(args: &DlqArgs, action: Option<&str>, limit: u32) -> anyhow::Result<()> {
    let wanted = match action {
        None => None,
        Some(a) => Some(Action::parse(a).with_context(|| {
            let all: Vec<&str> = Action::ORDER.iter().map(|a| a.as_str()).collect();
            format!("--action {a:?} is not one of: {}", all.join(", "))
        })?),
    };
    let store = Store::connect(&args.platform.store.database_url).await?;
    let listed = store.dead_letters(limit).await;
    store.close().await;
    let (list, total) = listed?;
    let mut shown = 0;
    for d in &list {
        let a = d.last_attempt_analysis();
        if wanted.is_some() && a.action != wanted {
            continue;
        }
        shown += 1;
        println!(
            "{}  rack {}  cycle {}  attempts {}  {}",
            d.hostname,
            d.rack,
            d.cycle,
            d.attempt,
            a.action.map_or("-", Action::as_str)
        );
        if a.components.is_empty() {
            println!("    {}", d.state_reason);
        }
        for c in &a.components {
            println!("    {}", c.headline);
        }
    }
    println!(
        "{shown} listed ({total} dead-lettered{})",
        action.map(|a| format!(", action {a}")).unwrap_or_default()
    );
    Ok(())
}

async fn resolve(
    args: &DlqArgs,
    hostname: &str,
    note: &str,
    by: Option<&str>,
) -> anyhow::Result<()> {
    let note = note.trim();
    if note.is_empty() {
        bail!("--note must say what was done (\"GPU 3 replaced, RMA 12345\")");
    }
    if note.chars().count() > NOTE_CHARS_MAX || note.chars().any(char::is_control) {
        bail!("--note must be one line of at most {NOTE_CHARS_MAX} characters");
    }
    let by = match by {
        Some(b) => b.trim().to_string(),
        None => std::env::var("USER").unwrap_or_else(|_| "unknown".into()),
    };
    if by.is_empty() || by.chars().any(char::is_control) {
        bail!("--by must name who did it");
    }
    let store = Store::connect(&args.platform.store.database_url).await?;
    let result = async {
        let h = dead_lettered(&store, hostname).await?;
        let now = now_ms();
        // The triage record (when the triage service made one) carries it to the next report;
        // the event keeps it in the node's history either way.
        let recorded = store.resolve_triage(hostname, &by, note, now).await?;
        store
            .add_event(hostname, &format!("resolved by {by}: {note}"), now)
            .await?;
        let done = requeue(&store, args, h).await?;
        Ok::<_, anyhow::Error>((recorded.is_some(), done))
    }
    .await;
    store.close().await;
    let (recorded, done) = result?;
    println!(
        "{hostname} resolved by {by}{}; {done}",
        if recorded {
            ""
        } else {
            " (no triage record yet: kept in the node's history only)"
        }
    );
    Ok(())
}

/// Queues the dead-lettered node of `h` as its next cycle: produce first, record second (as
/// intake does), so a node is never "queued" without a message.
async fn requeue(store: &Store, args: &DlqArgs, h: NodeHistory) -> anyhow::Result<String> {
    let hostname = h.node.spec.hostname.clone();
    let cycle = h.node.cycle + 1;
    let msg = NodeMessage::first(h.node.spec.clone(), cycle, now_ms());
    let producer = NodeProducer::new(ProducerConfig::new(&args.platform.bootstrap))?;
    producer.check_topic().await?;
    let delivery = producer
        .send_all(std::slice::from_ref(&msg), |_| {})
        .await
        .into_iter()
        .next()
        .context("no delivery report")??;
    store
        .record_queued(
            &[QueuedNode {
                spec: h.node.spec,
                cycle,
            }],
            now_ms(),
        )
        .await?;
    Ok(format!(
        "{hostname} requeued as cycle {cycle} (partition {}, offset {})",
        delivery.partition, delivery.offset
    ))
}
