//! The gRPC service. Every task serves it on its own address; only the chief's instance has a
//! [`CoordinationService`] behind it, and the others refuse every call with the chief's name, which
//! turns a task pointed at the wrong address into a clear error rather than a hang.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::Failure;
use super::TaskId;
use super::coordinator::{CheckIn, CoordinationService, HeartbeatCursor, Missing, Rendezvous};
use super::wire::{self, pb};

use pb::rendezvous_update::Update;

pub(crate) struct ClusterService {
    pub(crate) me: TaskId,
    pub(crate) chief: TaskId,
    pub(crate) chief_address: String,
    pub(crate) coordinator: Option<Arc<CoordinationService>>,
}

impl ClusterService {
    fn coordinator(&self) -> Result<Arc<CoordinationService>, Status> {
        self.coordinator.clone().ok_or_else(|| {
            Status::failed_precondition(format!(
                "{} is not the chief; the chief is {} at {}: check the cluster's addresses",
                self.me, self.chief, self.chief_address
            ))
        })
    }
}

fn peer<T>(request: &Request<T>) -> String {
    request.remote_addr().map_or_else(|| "an unknown address".to_owned(), |a| a.to_string())
}

type Stream<T> = ReceiverStream<Result<T, Status>>;

#[tonic::async_trait]
impl pb::cluster_server::Cluster for ClusterService {
    type CheckInStream = Stream<pb::RendezvousUpdate>;

    async fn check_in(&self, request: Request<pb::CheckInRequest>) -> Result<Response<Self::CheckInStream>, Status> {
        let coordinator = self.coordinator()?;
        let peer = peer(&request);
        let r = request.into_inner();
        let caller = (r.caller).ok_or_else(|| Status::invalid_argument("a check-in without a caller"))?;
        let task = wire::task(&caller.task)?;
        let (outcome, answering) = coordinator.check_in(CheckIn {
            task,
            incarnation: caller.incarnation,
            spec_hash: r.spec_hash,
            spec_keys: r.spec_keys.into_iter().collect(),
            version: r.version,
            peer,
            host: r.host,
            pid: r.pid,
            payload: r.payload,
        });
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            rendezvous_updates(coordinator, task, outcome, &tx).await;
            // Held until the task hangs up: it has read the last update then (or is gone).
            tx.closed().await;
            drop(answering);
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn barrier(&self, request: Request<pb::BarrierRequest>) -> Result<Response<pb::BarrierReply>, Status> {
        let coordinator = self.coordinator()?;
        let r = request.into_inner();
        let task = coordinator.caller(r.caller.as_ref())?;
        let outcome = coordinator.barrier(task, &r.name).await;
        let failure = outcome.err().as_ref().map(pb::Failure::from);
        Ok(Response::new(pb::BarrierReply { failure }))
    }

    type HeartbeatStream = Stream<pb::Pong>;

    async fn heartbeat(
        &self,
        request: Request<Streaming<pb::Ping>>,
    ) -> Result<Response<Self::HeartbeatStream>, Status> {
        let coordinator = self.coordinator()?;
        let mut pings = request.into_inner();
        let first =
            (pings.message().await?).ok_or_else(|| Status::invalid_argument("a heartbeat stream without a ping"))?;
        let task = coordinator.caller(first.caller.as_ref())?;
        if task == self.chief {
            return Err(Status::invalid_argument("the chief does not ping itself"));
        }
        let (tx, rx) = mpsc::channel(8);
        tokio::spawn(heartbeats(coordinator, task, first, pings, tx));
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn send_metrics(&self, request: Request<pb::MetricsRecord>) -> Result<Response<pb::MetricsReply>, Status> {
        let coordinator = self.coordinator()?;
        let r = request.into_inner();
        let task = coordinator.caller(r.caller.as_ref())?;
        coordinator.add_metrics(task, r.json);
        Ok(Response::new(pb::MetricsReply {}))
    }
}

/// How often a waiting task may hear again who is still missing. Told at every arrival, N
/// tasks would get N lists of up to N names each: O(N²) messages, a million at 1,024 tasks,
/// most of the chief's work in a rendezvous. Paced at a millisecond per task (100 ms at
/// least), the chief sends about a thousand lists a second however large the job, every task
/// hears O(1) messages in a rendezvous of bounded length, and the list a task reports at its
/// own startup timeout is at most one pace old.
fn waiting_pace(tasks: usize) -> Duration {
    let per_task = Duration::from_millis(u64::try_from(tasks).unwrap_or(u64::MAX));
    per_task.max(Duration::from_millis(100))
}

/// Streams who is still missing (paced, see [`waiting_pace`]), then the roster or the failure.
async fn rendezvous_updates(
    coordinator: Arc<CoordinationService>,
    task: TaskId,
    outcome: Result<u64, Failure>,
    tx: &mpsc::Sender<Result<pb::RendezvousUpdate, Status>>,
) {
    let send = |update| pb::RendezvousUpdate { update: Some(update) };
    let attempt = match outcome {
        Ok(attempt) => attempt,
        Err(refusal) => {
            let _ = tx.send(Ok(send(Update::Failure((&refusal).into())))).await;
            return;
        }
    };
    let mut decided = coordinator.subscribe_decided();
    let pace = waiting_pace(coordinator.tasks());
    let mut told = None;
    loop {
        let update = match coordinator.rendezvous(told) {
            Rendezvous::Done(roster) => Some(Update::Roster(roster.as_ref().into())),
            Rendezvous::Failed(f) => Some(Update::Failure((&f).into())),
            Rendezvous::Waiting(Some(Missing { version, tasks })) => {
                let names = tasks.iter().map(TaskId::to_string).collect();
                told = Some(version);
                if tx.send(Ok(send(Update::Waiting(pb::Waiting { missing: names })))).await.is_err() {
                    coordinator.withdraw(task, attempt);
                    return;
                }
                None
            }
            Rendezvous::Waiting(None) => None,
        };
        if let Some(last) = update {
            let _ = tx.send(Ok(send(last))).await;
            return;
        }
        tokio::select! {
            changed = decided.changed() => if changed.is_err() { return },
            () = tokio::time::sleep(pace) => {}
            () = tx.closed() => {
                eprintln!("trainrun: {task} left before the job started; it counts as missing again");
                coordinator.withdraw(task, attempt);
                return;
            }
        }
    }
}

/// Answers each ping, pushes what is new as it happens, and reports the stream's end.
async fn heartbeats(
    coordinator: Arc<CoordinationService>,
    task: TaskId,
    first: pb::Ping,
    mut pings: Streaming<pb::Ping>,
    tx: mpsc::Sender<Result<pb::Pong, Status>>,
) {
    let mut changes = coordinator.subscribe();
    let mut cursor = HeartbeatCursor::default();
    let mut ping = Some(first);
    loop {
        if let Some(p) = ping.take() {
            coordinator.ping(task, p.step_times.map(Into::into));
            if let Some(reason) = p.abort {
                coordinator.fail(Failure::Aborted { task, reason });
            }
            if p.leaving {
                coordinator.left(task);
                return;
            }
            let pong = coordinator.pong(&mut cursor, true);
            if let Some(pong) = pong
                && tx.send(Ok(pong)).await.is_err()
            {
                coordinator.closed(task, "it stopped reading the chief's answers");
                return;
            }
        }
        tokio::select! {
            message = pings.message() => match message {
                Ok(Some(p)) => ping = Some(p),
                Ok(None) => {
                    coordinator.closed(task, "the stream ended");
                    return;
                }
                Err(status) => {
                    coordinator.closed(task, status.message());
                    return;
                }
            },
            changed = changes.changed() => {
                if changed.is_err() {
                    return;
                }
                if let Some(pong) = coordinator.pong(&mut cursor, false)
                    && tx.send(Ok(pong)).await.is_err()
                {
                    coordinator.closed(task, "it stopped reading the chief's answers");
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tonic::Code;
    use tonic::transport::Endpoint;

    use super::pb::cluster_client::ClusterClient;
    use super::*;
    use crate::cluster::{ClusterConfig, ControlPlane, JobToken, Role, Timeouts};

    #[test]
    fn requests_without_the_right_token_are_refused() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let task = TaskId::new(Role::Worker, 0);
        let config = ClusterConfig {
            task,
            roster: [(task, address.to_string())].into(),
            chief: task,
            token: JobToken::new("the-right-token-0123456789", "the test").unwrap(),
            spec_hash: "spec".into(),
            spec_keys: Default::default(),
            version: "0.1.0".into(),
            timeouts: Timeouts::default(),
            payload: Vec::new(),
            tls: None,
            expendable: Vec::new(),
        };
        let plane = ControlPlane::start_on(config, listener).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let codes = runtime.block_on(async {
            let endpoint = Endpoint::from_shared(format!("http://{address}")).unwrap();
            let channel = endpoint.connect().await.unwrap();
            let with = |token: &'static str| {
                move |mut r: Request<()>| {
                    let value = format!("Bearer {token}").parse().unwrap();
                    r.metadata_mut().insert("authorization", value);
                    Ok(r)
                }
            };
            let record = pb::MetricsRecord::default();
            let mut bare = ClusterClient::new(channel.clone());
            let mut wrong = ClusterClient::with_interceptor(channel.clone(), with("wrong-token"));
            let mut right = ClusterClient::with_interceptor(channel, with("the-right-token-0123456789"));
            [
                bare.send_metrics(record.clone()).await.unwrap_err().code(),
                wrong.send_metrics(record.clone()).await.unwrap_err().code(),
                // Past the token check, the empty record itself is refused.
                right.send_metrics(record).await.unwrap_err().code(),
            ]
        });
        assert_eq!(codes, [Code::Unauthenticated, Code::Unauthenticated, Code::InvalidArgument]);
        drop(plane);
    }
}
