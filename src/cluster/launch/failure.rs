//! Which task a failed job is blamed on: the first to end, unless a task that noticed the
//! failure names another as hung or dead, or one ended of a cause no restart cures; and the
//! task's last lines to show with it.

use super::{CAUSE_WAIT, CLUSTER, HANG_GRACE, Launch, NOT_RESTARTED, Outcome, PREEMPTED, describe, keep, terminate};
use crate::cluster::task_output::Line;
use crate::cluster::{Blame, TaskId};
use std::collections::{BTreeMap, VecDeque};
use std::process::{Child, ExitStatus};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// What the launcher heard from the tasks: each one's last lines, and whom each blamed.
pub(super) struct Heard<'a> {
    pub(super) tails: &'a mut BTreeMap<TaskId, VecDeque<String>>,
    pub(super) blames: &'a mut BTreeMap<TaskId, Blame>,
    /// Tasks the launcher killed because they answered no stop within the grace period.
    pub(super) unanswered: &'a [TaskId],
}

/// The job failed first in `task` (ended with `status`): stops the others and says which task
/// caused it, with its last lines.
pub(super) fn failed(
    launch: &Launch,
    children: &mut BTreeMap<TaskId, Child>,
    rx: &mpsc::Receiver<Line>,
    heard: Heard<'_>,
    task: TaskId,
    status: ExitStatus,
) -> Outcome {
    let Heard { tails, blames, unanswered } = heard;
    let at = Instant::now();
    // Survivors usually notice the failure themselves and exit with an error naming it;
    // whoever has not after the grace period is killed. After a task found the job
    // broken, a survivor is most likely the task that hung.
    let noticed = status.code() == Some(CLUSTER);
    let earlier = if noticed { ended_first(children) } else { None };
    // Nobody saves but the chief: without it the others have nothing to finish (the ps tasks
    // and workers of a parameter-server job would wait for its word until their timeout).
    let chief_gone = launch.cluster.chief() == Some(task);
    let grace = if noticed || chief_gone { HANG_GRACE.min(launch.grace) } else { launch.grace };
    let killed = terminate(children, grace);

    // A peer that noticed first may have exited before the cause did: a task ending with
    // a code no restart cures (a full disk) is the one to act on.
    let incurable = |s: &ExitStatus| {
        s.code().and_then(|c| u8::try_from(c).ok()).is_some_and(|c| NOT_RESTARTED.contains(&c) && c != PREEMPTED as u8)
    };
    let cause = children.iter_mut().find_map(|(t, c)| c.try_wait().ok().flatten().filter(incurable).map(|s| (*t, s)));
    let (task, status) = cause.filter(|_| !incurable(&status)).or(earlier).unwrap_or((task, status));
    // Drain what the tasks said on the way out.
    while let Ok(line) = rx.recv_timeout(Duration::from_millis(50)) {
        match line {
            Line::Log(t, text) => keep(tails, t, text),
            Line::Blame(t, blame) => {
                blames.insert(t, blame);
            }
            Line::Event(_) => {}
        }
    }
    let (mut status, code) = describe(status);
    if unanswered.contains(&task) {
        status = format!(
            "it answered no stop request within {} s ({status}), so the launcher killed it",
            launch.grace.as_secs()
        );
    }
    let shown = |t: TaskId| {
        tails.get(&t).map_or(String::from("  (no output)"), |lines| {
            lines.iter().map(|l| format!("  [{t}] {l}")).collect::<Vec<_>>().join("\n")
        })
    };
    let mut tail = shown(task);
    let hung = stuck(noticed, task, &killed, blames);
    let task = match hung {
        Some(stuck) => {
            status = format!("hung: {task} found the job broken ({status}), {stuck} answered nothing and was killed");
            tail = format!("{}\n{tail}", shown(stuck));
            stuck
        }
        None => task,
    };
    tell_the_others(children.keys().copied(), task, &status);
    Outcome::Failed { task, status, tail, code, at }
}

/// Every other task's log (its `[task]` lines) says which task ended the job and how, as the
/// launcher stops it: a survivor that did not notice the failure itself is stopped before it
/// could say so.
fn tell_the_others(tasks: impl Iterator<Item = TaskId>, cause: TaskId, status: &str) {
    for t in tasks.filter(|t| *t != cause) {
        eprintln!("[{t}] {}", stopped_line(cause, status));
    }
}

/// The line each other task's log gets.
fn stopped_line(cause: TaskId, status: &str) -> String {
    format!("stopped by the launcher: {cause} failed ({status})")
}

/// The task that a task exiting with [`CLUSTER`] noticed, if it ended of something else: a
/// worker killed by a signal closes its sockets before the kernel lets it be reaped, so its
/// peer can be reaped first; this waits up to [`CAUSE_WAIT`] for such a cause to be reaped.
fn ended_first(children: &mut BTreeMap<TaskId, Child>) -> Option<(TaskId, ExitStatus)> {
    let deadline = Instant::now() + CAUSE_WAIT;
    loop {
        let cause = children.iter_mut().find_map(|(t, c)| {
            c.try_wait().ok().flatten().filter(|s| !s.success() && s.code() != Some(CLUSTER)).map(|s| (*t, s))
        });
        if cause.is_some() || Instant::now() >= deadline {
            return cause;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The cause of a hang is the task that hung, not the one that noticed it (`task`): one that
/// a task blamed as hung, as data (see [`super::blame_line`]), and that then answered no SIGTERM
/// either (`killed`).
fn stuck(noticed: bool, task: TaskId, killed: &[TaskId], blames: &BTreeMap<TaskId, Blame>) -> Option<TaskId> {
    let blamed = |t: TaskId| blames.values().any(|b| *b == Blame::Hung(t));
    killed.iter().copied().find(|&t| noticed && t != task && blamed(t))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> TaskId {
        s.parse().unwrap()
    }

    #[test]
    fn the_others_are_told_the_cause_in_the_launchers_words() {
        assert_eq!(
            stopped_line(t("worker:17"), "killed by signal 9"),
            "stopped by the launcher: worker:17 failed (killed by signal 9)"
        );
    }

    #[test]
    fn the_stuck_task_is_the_killed_one_another_blamed_as_hung_whatever_the_logs_say() {
        let (w0, w1, w2) = (t("worker:0"), t("worker:1"), t("worker:2"));
        let blames = BTreeMap::from([(w0, Blame::Hung(w2))]);
        // worker:1 was killed too (it was slow to exit) but nobody blamed it.
        assert_eq!(stuck(true, w0, &[w1, w2], &blames), Some(w2));
        assert_eq!(stuck(false, w0, &[w1, w2], &blames), None, "a task that did not find the job broken");
        assert_eq!(stuck(true, w0, &[w1], &blames), None, "the blamed task exited on SIGTERM");
        let died = BTreeMap::from([(w0, Blame::Died(w2))]);
        assert_eq!(stuck(true, w0, &[w2], &died), None, "a dead task is no hang");
    }
}
