//! Callbacks used by Storage API

use std::io;

use tokio::sync::mpsc;
use tokio::sync::oneshot;

use crate::async_runtime::AsyncOneshotSendExt;
use crate::core::notify::Notify;
use crate::raft_state::io_state::log_io_id::LogIOId;
use crate::type_config::alias::OneshotSenderOf;
use crate::LogId;
use crate::RaftTypeConfig;
use crate::StorageIOError;
use crate::Vote;

/// A oneshot callback for completion of log io operation.
pub struct LogFlushed<C>
where C: RaftTypeConfig
{
    log_io_id: LogIOId<C::NodeId>,
    tx: FlushedTx<C>,
}

/// Kiln patch: who hears of the flush.
enum FlushedTx<C>
where C: RaftTypeConfig
{
    /// The Raft core waits for it (a follower's append, answered once flushed).
    Waiting(OneshotSenderOf<C, Result<LogIOId<C::NodeId>, io::Error>>),
    /// The Raft core goes on and is told later (a leader's own append, see
    /// `RaftCore::append_to_log_behind`): the leader of `vote` counts the entries as its own
    /// once flushed.
    Notify {
        vote: Vote<C::NodeId>,
        tx: mpsc::UnboundedSender<Notify<C>>,
    },
}

impl<C> LogFlushed<C>
where C: RaftTypeConfig
{
    pub(crate) fn new(
        log_io_id: LogIOId<C::NodeId>,
        tx: OneshotSenderOf<C, Result<LogIOId<C::NodeId>, io::Error>>,
    ) -> Self {
        Self {
            log_io_id,
            tx: FlushedTx::Waiting(tx),
        }
    }

    /// Kiln patch: a callback that tells the Raft core through its notification channel.
    pub(crate) fn notifying(
        log_io_id: LogIOId<C::NodeId>,
        vote: Vote<C::NodeId>,
        tx: mpsc::UnboundedSender<Notify<C>>,
    ) -> Self {
        Self {
            log_io_id,
            tx: FlushedTx::Notify { vote, tx },
        }
    }

    /// Report log io completion event.
    ///
    /// It will be called when the log is successfully appended to the storage or an error occurs.
    /// Kiln patch: a store must report its appends' flushes in the order it was given them.
    pub fn log_io_completed(self, result: Result<(), io::Error>) {
        if let Err(e) = &result {
            tracing::error!("LogFlush error: {}, while flushing upto {}", e, self.log_io_id);
        }
        match self.tx {
            FlushedTx::Waiting(tx) => {
                let res = tx.send(result.map(|()| self.log_io_id));
                if let Err(e) = res {
                    tracing::error!("failed to send log io completion event: {:?}", e);
                }
            }
            FlushedTx::Notify { vote, tx } => {
                let notify = Notify::LocalLogFlushed {
                    vote,
                    log_id: self.log_io_id.log_id,
                    result: result.map_err(|e| e.to_string()),
                };
                // The core has stopped: nobody is left to count the entries.
                let _ = tx.send(notify);
            }
        }
    }
}

/// A oneshot callback for completion of applying logs to state machine.
pub struct LogApplied<C>
where C: RaftTypeConfig
{
    last_log_id: LogId<C::NodeId>,
    tx: oneshot::Sender<Result<(LogId<C::NodeId>, Vec<C::R>), StorageIOError<C::NodeId>>>,
}

impl<C> LogApplied<C>
where C: RaftTypeConfig
{
    #[allow(dead_code)]
    pub(crate) fn new(
        last_log_id: LogId<C::NodeId>,
        tx: oneshot::Sender<Result<(LogId<C::NodeId>, Vec<C::R>), StorageIOError<C::NodeId>>>,
    ) -> Self {
        Self { last_log_id, tx }
    }

    /// Report apply io completion event.
    ///
    /// It will be called when the log is successfully applied to the state machine or an error
    /// occurs.
    pub fn completed(self, result: Result<Vec<C::R>, StorageIOError<C::NodeId>>) {
        let res = match result {
            Ok(x) => {
                tracing::debug!("LogApplied upto {}", self.last_log_id);
                let resp = (self.last_log_id.clone(), x);
                self.tx.send(Ok(resp))
            }
            Err(e) => {
                tracing::error!("LogApplied error: {}, while applying upto {}", e, self.last_log_id);
                self.tx.send(Err(e))
            }
        };

        if let Err(_e) = res {
            tracing::error!("failed to send apply complete event, last_log_id: {}", self.last_log_id);
        }
    }
}
