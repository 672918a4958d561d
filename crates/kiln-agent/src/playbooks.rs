//! Which playbook a node runs. Either one playbook for every node (`playbook = FILE`), or a
//! set (`playbooks = [FILES]`) from which each node gets the one whose `gpu_models` lists the
//! node's manifest `gpu_model` (case-insensitive); a playbook with `gpu_models: []` is for
//! nodes without GPUs. Two playbooks claiming one model is a settings error at start; a node
//! no playbook is for gets an error that its run records (see `agent::run_playbook`).

use std::path::PathBuf;

use anyhow::{anyhow, bail};
use kiln_checks::Playbook;

/// Step kinds that need no shell on the node (the BMC's, and scripted test checks).
const SHELL_FREE_KINDS: [&str; 6] = [
    "bmc_health",
    "bmc_firmware",
    "bmc_sel",
    "bmc_chassis",
    "bmc_inventory",
    "scripted",
];

pub enum PlaybookSet {
    /// Every node runs this one.
    One(Playbook),
    /// Chosen by the node's `gpu_model`.
    ByModel(Vec<Playbook>),
}

impl PlaybookSet {
    /// Loads `single` or every file of `set` (exactly one of the two must be given).
    pub fn load(single: Option<&PathBuf>, set: &[PathBuf]) -> anyhow::Result<PlaybookSet> {
        match (single, set.is_empty()) {
            (Some(_), false) => bail!("give either playbook or playbooks, not both"),
            (None, true) => bail!("no playbook: set playbook = FILE or playbooks = [FILES]"),
            (Some(p), true) => Ok(PlaybookSet::One(
                Playbook::load_file(p).map_err(|e| anyhow!("{e}"))?,
            )),
            (None, false) => {
                let mut all: Vec<Playbook> = Vec::new();
                for p in set {
                    let pb = Playbook::load_file(p).map_err(|e| anyhow!("{e}"))?;
                    for other in &all {
                        if let Some(m) = shared_model(other, &pb) {
                            bail!(
                                "playbooks {} and {} are both for gpu_model {m}",
                                other.name,
                                pb.name
                            );
                        }
                    }
                    all.push(pb);
                }
                Ok(PlaybookSet::ByModel(all))
            }
        }
    }

    /// The playbook for a node, or why there is none.
    pub fn for_node(&self, gpu_model: &str, gpu_count: u32) -> Result<&Playbook, String> {
        let all = match self {
            PlaybookSet::One(p) => return Ok(p),
            PlaybookSet::ByModel(all) => all,
        };
        let model = gpu_model.trim();
        let cpu_only = model.is_empty() || gpu_count == 0;
        let found = all.iter().find(|p| {
            if cpu_only {
                p.gpu_models.is_empty()
            } else {
                p.gpu_models.iter().any(|m| m.eq_ignore_ascii_case(model))
            }
        });
        found.ok_or_else(|| {
            let known = all
                .iter()
                .map(|p| {
                    if p.gpu_models.is_empty() {
                        format!("{} (nodes without GPUs)", p.name)
                    } else {
                        format!("{} ({})", p.name, p.gpu_models.join(", "))
                    }
                })
                .collect::<Vec<_>>()
                .join("; ");
            let what = if cpu_only {
                "nodes without GPUs".to_string()
            } else {
                format!("gpu_model {model:?}")
            };
            format!("no configured playbook is for {what}; configured: {known}")
        })
    }

    /// A playbook name for logs.
    pub fn describe(&self) -> String {
        match self {
            PlaybookSet::One(p) => p.name.clone(),
            PlaybookSet::ByModel(all) => all
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>()
                .join(","),
        }
    }
}

/// True when some step of `pb` runs commands on the node.
pub fn needs_shell(pb: &Playbook) -> bool {
    pb.steps
        .iter()
        .any(|s| !SHELL_FREE_KINDS.contains(&s.kind.as_str()))
}

/// Whether the playbook talks to the BMC (only then is a Redfish client built for a run:
/// building one loads the trust store, a few milliseconds each time).
pub fn needs_bmc(pb: &Playbook) -> bool {
    pb.steps.iter().any(|s| s.kind.starts_with("bmc_"))
}

fn shared_model(a: &Playbook, b: &Playbook) -> Option<String> {
    if a.gpu_models.is_empty() && b.gpu_models.is_empty() {
        return Some("(none: nodes without GPUs)".into());
    }
    a.gpu_models
        .iter()
        .find(|m| b.gpu_models.iter().any(|n| n.eq_ignore_ascii_case(m)))
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &std::path::Path, name: &str, models: &str, check: &str) -> PathBuf {
        let p = dir.join(format!("{name}.yaml"));
        std::fs::write(
            &p,
            format!("playbook: {name}\ngpu_models: {models}\nchecks:\n - check: {check}\n"),
        )
        .expect("write");
        p
    }

    #[test]
    fn picks_by_gpu_model_and_explains_a_miss() {
        let dir = tempfile::tempdir().expect("tempdir");
        let h100 = write(dir.path(), "h100", "[H100-SXM]", "bmc_health");
        let cpu = write(dir.path(), "cpu", "[]", "bmc_health");
        let set = PlaybookSet::load(None, &[h100.clone(), cpu.clone()]).expect("load");
        assert_eq!(set.for_node("h100-sxm", 8).expect("match").name, "h100");
        assert_eq!(set.for_node("", 0).expect("cpu").name, "cpu");
        let miss = set.for_node("B200", 8).expect_err("no match");
        assert_eq!(
            miss,
            "no configured playbook is for gpu_model \"B200\"; configured: h100 (H100-SXM); \
             cpu (nodes without GPUs)"
        );
        let only_gpu = PlaybookSet::load(None, std::slice::from_ref(&h100)).expect("load");
        assert!(only_gpu
            .for_node("", 0)
            .expect_err("no cpu playbook")
            .contains("nodes without GPUs"));

        let dup = write(dir.path(), "dup", "[h100-sxm]", "bmc_health");
        let err = PlaybookSet::load(None, &[h100.clone(), dup])
            .err()
            .expect("duplicate model refused");
        assert!(err.to_string().contains("both for gpu_model"), "{err}");
        assert!(PlaybookSet::load(Some(&h100), &[cpu]).is_err());
        assert!(PlaybookSet::load(None, &[]).is_err());
    }

    #[test]
    fn shell_need_follows_step_kinds() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bmc = Playbook::load_file(&write(dir.path(), "b", "[]", "bmc_sel")).expect("load");
        assert!(!needs_shell(&bmc));
        assert!(needs_bmc(&bmc));
        let p = dir.path().join("eth.yaml");
        std::fs::write(
            &p,
            "playbook: e\nchecks:\n - check: ethernet\n   interfaces: [a]\n   mtu: 1500\n",
        )
        .expect("write");
        let eth = Playbook::load_file(&p).expect("load");
        assert!(needs_shell(&eth));
        assert!(!needs_bmc(&eth));
        let chassis =
            Playbook::load_file(&write(dir.path(), "c", "[]", "bmc_chassis")).expect("load");
        assert!(!needs_shell(&chassis), "bmc_chassis needs no shell");
    }
}
