//! What one task knows of the job: whether it failed (and why), and the chief's commands not
//! yet taken. The chief's coordinator or the heartbeat stream writes it; the trainer, and any
//! thread holding a [`Health`], read it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::watch;

use super::stragglers::StepClock;
use super::{ClusterError, Command, Failure};

/// This task's knowledge of the job: its failure, if any, and the commands not yet taken;
/// and its own step times, which its heartbeat reports.
pub(crate) struct Local {
    state: Mutex<LocalState>,
    changed: watch::Sender<u64>,
    pub(crate) clock: StepClock,
}

#[derive(Default)]
struct LocalState {
    failure: Option<Failure>,
    commands: VecDeque<Command>,
    seen: u64,
}

impl Local {
    pub(crate) fn new() -> Arc<Local> {
        Arc::new(Local {
            state: Mutex::new(LocalState::default()),
            changed: watch::Sender::new(0),
            clock: StepClock::default(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, LocalState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records the job's failure; the first one stays.
    pub(crate) fn fail(&self, failure: Failure) {
        let mut state = self.lock();
        if state.failure.is_none() {
            state.failure = Some(failure);
            self.changed.send_modify(|v| *v = v.wrapping_add(1));
        }
    }

    pub(crate) fn failure(&self) -> Option<Failure> {
        self.lock().failure.clone()
    }

    pub(crate) async fn failed(&self) -> Failure {
        let mut changes = self.changed.subscribe();
        loop {
            if let Some(f) = self.failure() {
                return f;
            }
            if changes.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Queues a chief's command once, however often it arrives.
    pub(crate) fn deliver(&self, seq: u64, command: Command) {
        let mut state = self.lock();
        if seq > state.seen {
            state.seen = seq;
            state.commands.push_back(command);
        }
    }

    pub(crate) fn push(&self, command: Command) {
        self.lock().commands.push_back(command);
    }

    pub(crate) fn pop(&self) -> Option<Command> {
        self.lock().commands.pop_front()
    }

    pub(crate) fn check(&self) -> Result<(), ClusterError> {
        self.failure().map_or(Ok(()), |f| Err(f.into()))
    }
}

/// A cheap, clonable view of the job's health for threads other than the trainer's, e.g. a
/// data-plane transfer that should give up when a peer is known dead.
#[derive(Clone)]
pub struct Health(pub(crate) Arc<Local>);

impl Health {
    /// `Err` once the job has failed, naming the cause.
    pub fn check(&self) -> Result<(), ClusterError> {
        self.0.check()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_is_queued_once_however_often_it_arrives() {
        let local = Local::new();
        let stop = Command::Stop { reason: "done".into() };
        local.deliver(1, Command::Save { step: 3 });
        local.deliver(1, Command::Save { step: 3 });
        local.deliver(2, stop.clone());
        assert_eq!(local.pop(), Some(Command::Save { step: 3 }));
        assert_eq!(local.pop(), Some(stop));
        assert_eq!(local.pop(), None);
    }
}
