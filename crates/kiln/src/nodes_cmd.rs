//! `kiln nodes show HOST` (a node's state, runs, checks and events from the store) and
//! `kiln dlq requeue HOST` (a dead-lettered node back on `kiln.nodes` as its next cycle).

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use kiln_queue::{now_ms, NodeMessage, NodeProducer, ProducerConfig};
use kiln_store::{CheckVerdict, NodeState, QueuedNode, Store};

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
}

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
    let DlqCommand::Requeue { hostname } = &args.command;
    let store = Store::connect(&args.platform.store.database_url).await?;
    let Some(h) = store.node_history(hostname).await? else {
        bail!("no node {hostname:?} in the store");
    };
    if h.node.state != NodeState::DeadLettered {
        bail!(
            "{hostname} is {} (cycle {}, attempt {}), not dead_lettered: nothing to requeue",
            h.node.state,
            h.node.cycle,
            h.node.attempt
        );
    }
    let cycle = h.node.cycle + 1;
    let msg = NodeMessage::first(h.node.spec.clone(), cycle, now_ms());
    // Produce first, record second (as intake does): a node is never "queued" without a message.
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
    store.close().await;
    println!(
        "{hostname} requeued as cycle {cycle} (partition {}, offset {})",
        delivery.partition, delivery.offset
    );
    Ok(())
}
