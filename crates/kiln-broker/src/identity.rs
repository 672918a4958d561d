//! The data directory's identity: which node owns it and which cluster it belongs to.
//! A directory is locked while a broker uses it, and a broker refuses a directory
//! that belongs to another node id. The cluster id is learnt from the metadata log and written
//! here once, so a restarted broker reports it from its first answer on.

use std::fs::{self, File};
use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Identity {
    pub node_id: i32,
    /// The cluster's id, once learnt (`None`: a new directory whose cluster has not named
    /// itself yet).
    #[serde(default)]
    pub cluster_id: Option<String>,
    /// Drawn at random when the directory is created, registered in the cluster's metadata:
    /// a broker whose directory was lost comes back with a different one, and its peers tell
    /// it so (`cluster/join.rs`). 0 in directories written before incarnations existed; those
    /// draw one on their next start.
    #[serde(default)]
    pub incarnation: u64,
}

/// A random, non-zero incarnation.
fn new_incarnation() -> u64 {
    let (high, low) = uuid::Uuid::new_v4().as_u64_pair();
    (high ^ low).max(1)
}

/// Holds the data directory's lock for as long as it lives.
pub struct DataDirLock {
    _file: File,
}

pub fn lock_data_dir(data_dir: &Path) -> anyhow::Result<DataDirLock> {
    fs::create_dir_all(data_dir)
        .with_context(|| format!("creating data directory {}", data_dir.display()))?;
    let path = data_dir.join(".lock");
    let file = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(DataDirLock { _file: file }),
        Err(fs::TryLockError::WouldBlock) => bail!(
            "data directory {} is in use by another kiln broker (lock held on {})",
            data_dir.display(),
            path.display()
        ),
        Err(fs::TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("locking {}", path.display()))
        }
    }
}

/// Reads `broker.json`, or makes a new identity on first start; the flag says whether it is
/// new. A new identity is not saved here: the caller saves it once the directory may be used
/// (a broker refused by its peers must be refused again on its next start).
pub fn load_or_create(data_dir: &Path, node_id: i32) -> anyhow::Result<(Identity, bool)> {
    let path = data_dir.join("broker.json");
    if path.exists() {
        let text =
            fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let identity: Identity = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a valid broker identity", path.display()))?;
        if identity.node_id != node_id {
            bail!(
                "data directory {} belongs to node {}, but this broker is configured as node {}",
                data_dir.display(),
                identity.node_id,
                node_id
            );
        }
        let mut identity = identity;
        if identity.incarnation == 0 {
            identity.incarnation = new_incarnation();
            save(data_dir, &identity)?;
        }
        return Ok((identity, false));
    }
    let identity = Identity {
        node_id,
        cluster_id: None,
        incarnation: new_incarnation(),
    };
    Ok((identity, true))
}

/// Writes `broker.json` atomically (temporary file, fsync, rename, directory fsync).
pub fn save(data_dir: &Path, identity: &Identity) -> anyhow::Result<()> {
    let path = data_dir.join("broker.json");
    let tmp = data_dir.join("broker.json.tmp");
    let mut file = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    file.write_all(&serde_json::to_vec_pretty(identity)?)?;
    file.sync_all()?;
    fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
    File::open(data_dir)?.sync_all()?;
    Ok(())
}
