//! NIC checks: InfiniBand from sysfs (`ib`), Ethernet from `ip -j link` and sysfs (`eth`).
//! Both parse text the agent fetches over the node's shell, so they work over any shell and
//! on a saved snapshot (`sysfs_root`, or `kiln playbook run --sysfs-root DIR`).

pub mod eth;
pub mod ib;

use serde_json::json;

use crate::check::{boxed, Check, CheckContext, CheckFuture, CheckResult};
use crate::gpu::tail;

pub use eth::{parse_ip_links, EthernetExpect, IpLink};
pub use ib::{ib_dump_command, parse_ib_dump, IbHca, IbPort, InfinibandExpect};

/// A NIC check as a playbook step.
pub struct NicCheck {
    pub name: String,
    pub kind: NicExpect,
    pub command_timeout: std::time::Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub enum NicExpect {
    Infiniband(InfinibandExpect),
    Ethernet(EthernetExpect),
}

impl NicExpect {
    /// Reads sysfs under `root` instead of the playbook's `sysfs_root` (a saved snapshot).
    pub fn set_sysfs_root(&mut self, root: &str) {
        match self {
            NicExpect::Infiniband(t) => t.sysfs_root = root.to_string(),
            NicExpect::Ethernet(t) => t.sysfs_root = root.to_string(),
        }
    }
}

impl Check for NicCheck {
    fn name(&self) -> &str {
        &self.name
    }

    fn run<'a>(&'a self, ctx: &'a CheckContext) -> CheckFuture<'a> {
        boxed(async move {
            let shell = match ctx.shell() {
                Ok(s) => s,
                Err(e) => return CheckResult::error(&self.name, e),
            };
            let command = match &self.kind {
                NicExpect::Infiniband(t) => ib_dump_command(&t.sysfs_root),
                NicExpect::Ethernet(t) => t.full_command(),
            };
            let timeout = self.command_timeout.min(ctx.remaining());
            let out = match shell.exec(&command, timeout).await {
                Ok(o) => o,
                Err(e) => {
                    return CheckResult::error(
                        &self.name,
                        format!("{} on {}: {e}", self.name, shell.describe()),
                    )
                }
            };
            match &self.kind {
                NicExpect::Infiniband(t) => {
                    let hcas = parse_ib_dump(&out.stdout);
                    // The first InfiniBand step of a run keeps the port counters; a later one
                    // (after stress) compares with them.
                    let baseline = ctx.recall(ib::COUNTERS_MEMO).await;
                    if baseline.is_none() {
                        ctx.remember(ib::COUNTERS_MEMO, ib::counters_json(&hcas))
                            .await;
                    }
                    t.evaluate(&self.name, &hcas, baseline.as_ref())
                }
                NicExpect::Ethernet(t) => {
                    if out.exit_code != Some(0) {
                        return CheckResult::error(
                            &self.name,
                            format!(
                                "`{}` exited with {:?}: {}",
                                t.command,
                                out.exit_code,
                                tail(&out.stderr, 300)
                            ),
                        );
                    }
                    match eth::parse_eth_dump(&out.stdout) {
                        Ok(dump) => t.evaluate(&self.name, &dump, &ctx.node.labels),
                        Err(e) => CheckResult::error(&self.name, e)
                            .evidence(json!({ "stdout": tail(&out.stdout, 2000) })),
                    }
                }
            }
        })
    }
}
