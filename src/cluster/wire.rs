//! The generated protobuf types and their conversion to and from the module's own types.
//! Everything a peer sends is parsed here, once; a malformed message becomes an error.

use std::time::Duration;

use super::{Command, Failure, Member, Roster, StepTimes, TaskId};

#[allow(clippy::all, clippy::pedantic)]
pub(crate) mod pb {
    tonic::include_proto!("trainrun.cluster.v1");
}

use pb::failure::Kind as Fk;

/// A message from a peer that does not parse, with what was wrong.
#[derive(Debug)]
pub(crate) struct Malformed(pub(crate) String);

impl From<Malformed> for tonic::Status {
    fn from(m: Malformed) -> tonic::Status {
        tonic::Status::invalid_argument(m.0)
    }
}

pub(crate) fn task(s: &str) -> Result<TaskId, Malformed> {
    s.parse().map_err(|e: super::ParseTaskIdError| Malformed(e.to_string()))
}

fn tasks(v: &[String]) -> Result<Vec<TaskId>, Malformed> {
    v.iter().map(|s| task(s)).collect()
}

fn names(v: &[TaskId]) -> Vec<String> {
    v.iter().map(TaskId::to_string).collect()
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl From<&Failure> for pb::Failure {
    fn from(f: &Failure) -> pb::Failure {
        let kind = match f {
            Failure::SpecMismatch { task, spec_hash, version, chief, chief_spec_hash, chief_version, keys } => {
                Fk::SpecMismatch(pb::SpecMismatch {
                    task: task.to_string(),
                    spec_hash: spec_hash.clone(),
                    version: version.clone(),
                    chief: chief.to_string(),
                    chief_spec_hash: chief_spec_hash.clone(),
                    chief_version: chief_version.clone(),
                    keys: keys.clone(),
                })
            }
            Failure::UnknownTask { task, known } => {
                Fk::UnknownTask(pb::UnknownTask { task: task.to_string(), known: names(known) })
            }
            Failure::DuplicateTask { task, first, second } => Fk::DuplicateTask(pb::DuplicateTask {
                task: task.to_string(),
                first: first.clone(),
                second: second.clone(),
            }),
            Failure::RendezvousTimeout { after, missing } => {
                Fk::RendezvousTimeout(pb::RendezvousTimeout { after_ms: ms(*after), missing: names(missing) })
            }
            Failure::BarrierTimeout { name, after, missing } => Fk::BarrierTimeout(pb::BarrierTimeout {
                name: name.clone(),
                after_ms: ms(*after),
                missing: names(missing),
            }),
            Failure::Died { task, detail } => Fk::Died(pb::Died { task: task.to_string(), detail: detail.clone() }),
            Failure::Silent { task, after } => Fk::Silent(pb::Silent { task: task.to_string(), after_ms: ms(*after) }),
            Failure::Aborted { task, reason } => {
                Fk::Aborted(pb::Aborted { task: task.to_string(), reason: reason.clone() })
            }
        };
        pb::Failure { kind: Some(kind) }
    }
}

pub(crate) fn failure(f: pb::Failure) -> Result<Failure, Malformed> {
    let kind = f.kind.ok_or_else(|| Malformed("a failure without a kind".into()))?;
    Ok(match kind {
        Fk::SpecMismatch(m) => Failure::SpecMismatch {
            task: task(&m.task)?,
            spec_hash: m.spec_hash,
            version: m.version,
            chief: task(&m.chief)?,
            chief_spec_hash: m.chief_spec_hash,
            chief_version: m.chief_version,
            keys: m.keys,
        },
        Fk::UnknownTask(m) => Failure::UnknownTask { task: task(&m.task)?, known: tasks(&m.known)? },
        Fk::DuplicateTask(m) => Failure::DuplicateTask { task: task(&m.task)?, first: m.first, second: m.second },
        Fk::RendezvousTimeout(m) => {
            Failure::RendezvousTimeout { after: Duration::from_millis(m.after_ms), missing: tasks(&m.missing)? }
        }
        Fk::BarrierTimeout(m) => Failure::BarrierTimeout {
            name: m.name,
            after: Duration::from_millis(m.after_ms),
            missing: tasks(&m.missing)?,
        },
        Fk::Died(m) => Failure::Died { task: task(&m.task)?, detail: m.detail },
        Fk::Silent(m) => Failure::Silent { task: task(&m.task)?, after: Duration::from_millis(m.after_ms) },
        Fk::Aborted(m) => Failure::Aborted { task: task(&m.task)?, reason: m.reason },
    })
}

pub(crate) fn command(seq: u64, c: &Command) -> pb::Command {
    let kind = match c {
        Command::Stop { reason } => pb::command::Kind::Stop(pb::Stop { reason: reason.clone() }),
        Command::Save { step } => pb::command::Kind::Save(pb::Save { step: *step }),
    };
    pb::Command { seq, kind: Some(kind) }
}

/// A command and its sequence number.
pub(crate) fn command_from(c: pb::Command) -> Result<(u64, Command), Malformed> {
    let command = match c.kind {
        Some(pb::command::Kind::Stop(s)) => Command::Stop { reason: s.reason },
        Some(pb::command::Kind::Save(s)) => Command::Save { step: s.step },
        None => return Err(Malformed("a command without a kind".into())),
    };
    Ok((c.seq, command))
}

impl From<StepTimes> for pb::StepTimes {
    fn from(t: StepTimes) -> pb::StepTimes {
        pb::StepTimes { steps: t.steps, p50_ms: t.p50_ms, p90_ms: t.p90_ms, max_ms: t.max_ms }
    }
}

impl From<pb::StepTimes> for StepTimes {
    fn from(t: pb::StepTimes) -> StepTimes {
        StepTimes { steps: t.steps, p50_ms: t.p50_ms, p90_ms: t.p90_ms, max_ms: t.max_ms }
    }
}

impl From<&Roster> for pb::Roster {
    fn from(r: &Roster) -> pb::Roster {
        let members = r
            .members
            .iter()
            .map(|m| pb::Member {
                task: m.task.to_string(),
                address: m.address.clone(),
                host: m.host.clone(),
                pid: m.pid,
                payload: m.payload.clone(),
            })
            .collect();
        pb::Roster { members }
    }
}

pub(crate) fn roster(r: pb::Roster) -> Result<Roster, Malformed> {
    let mut members = Vec::with_capacity(r.members.len());
    for (rank, m) in r.members.into_iter().enumerate() {
        members.push(Member {
            task: task(&m.task)?,
            rank,
            address: m.address,
            host: m.host,
            pid: m.pid,
            payload: m.payload,
        });
    }
    if !members.is_sorted_by(|a, b| a.task < b.task) {
        return Err(Malformed("a roster out of rank order".into()));
    }
    Ok(Roster { members })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Role;

    #[test]
    fn failures_survive_the_wire() {
        let w = |i| TaskId::new(Role::Worker, i);
        let all = [
            Failure::UnknownTask { task: w(9), known: vec![w(0), w(1)] },
            Failure::BarrierTimeout { name: "epoch-1".into(), after: Duration::from_millis(1500), missing: vec![w(2)] },
            Failure::Silent { task: w(0), after: Duration::from_secs(3) },
        ];
        for f in all {
            let back = failure(pb::Failure::from(&f)).unwrap();
            assert_eq!(back, f);
        }
    }

    #[test]
    fn malformed_messages_are_errors() {
        let bad = pb::Failure { kind: Some(Fk::Died(pb::Died { task: "boss:1".into(), detail: String::new() })) };
        assert!(failure(bad).is_err());
        assert!(failure(pb::Failure { kind: None }).is_err());
        let unordered = pb::Roster {
            members: ["worker:1", "worker:0"].map(|t| pb::Member { task: t.into(), ..Default::default() }).into(),
        };
        assert!(roster(unordered).is_err());
    }
}
