//! A non-chief task's link to the chief: check-in (retried until the startup timeout, since
//! the chief may start last), barriers, metrics, and the heartbeat stream that tells this task
//! when the job fails, the chief dies or hangs, or a command arrives.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, MissedTickBehavior, sleep_until, timeout, timeout_at};
use tokio_stream::wrappers::ReceiverStream;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use super::auth::AddToken;
use super::health::Local;
use super::plane::{MAX_MESSAGE, Settings, window_sizes};
use super::tls::{TlsMaterial, explain as explain_tls, host_of};
use super::wire::{self, Malformed, pb};
use super::{ClusterError, Command, Failure, JobToken, Roster, TaskId};
use crate::collective::stranger::{self, Answer};

use pb::rendezvous_update::Update;

type Client = pb::cluster_client::ClusterClient<InterceptedService<Channel, AddToken>>;

/// Pause between check-in attempts while the chief is not up yet.
const RETRY: Duration = Duration::from_millis(100);

/// How long a probe of the chief's address waits for an answer.
const PROBE_WAIT: Duration = Duration::from_secs(1);

/// A trainrun chief never accepts a connection and closes it; something that keeps doing so
/// for this long is not one.
const CLOSED_LIMIT: Duration = Duration::from_secs(3);

/// What the plane asks of the heartbeat task.
pub(crate) enum HeartbeatControl {
    /// Say goodbye and end the stream: this task shuts down cleanly.
    Leave,
    /// Fail the job for this reason.
    Abort(String),
}

enum Attempt {
    Retry(String),
    Fatal(ClusterError),
}

pub(crate) struct ChiefLink {
    settings: Arc<Settings>,
    local: Arc<Local>,
    client: Client,
    address: String,
    /// Whether this task speaks TLS: then a TLS server at the chief's address is expected.
    tls: bool,
}

impl ChiefLink {
    /// Connects lazily: the chief may not be listening yet. Call inside the runtime.
    pub(crate) fn new(
        settings: Arc<Settings>,
        local: Arc<Local>,
        token: &JobToken,
        tls: Option<&TlsMaterial>,
    ) -> Result<ChiefLink, ClusterError> {
        let address = (settings.roster.get(&settings.chief).cloned()).unwrap_or_default();
        let (stream_window, connection_window) = window_sizes();
        let bad = |e: tonic::transport::Error| ClusterError::Config(format!("the chief's address `{address}`: {e}"));
        let scheme = if tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{address}")).map_err(bad)?;
        if let Some(tls) = tls {
            endpoint = endpoint.tls_config(tls.client(host_of(&address))).map_err(bad)?;
        }
        let endpoint = endpoint
            .connect_timeout(Duration::from_secs(2))
            .tcp_nodelay(true)
            .initial_stream_window_size(stream_window)
            .initial_connection_window_size(connection_window);
        let channel = InterceptedService::new(endpoint.connect_lazy(), AddToken::new(token)?);
        let client = Client::new(channel).max_decoding_message_size(MAX_MESSAGE).max_encoding_message_size(MAX_MESSAGE);
        Ok(ChiefLink { settings, local, client, address, tls: tls.is_some() })
    }

    fn caller(&self) -> pb::Caller {
        pb::Caller { task: self.settings.task.to_string(), incarnation: self.settings.incarnation }
    }

    fn chief(&self) -> TaskId {
        self.settings.chief
    }

    fn malformed(&self, m: Malformed) -> ClusterError {
        ClusterError::Protocol { chief: self.chief(), address: self.address.clone(), message: m.0 }
    }

    /// The chief's answer as an error, unless the chief is only unreachable for now.
    fn classify(&self, status: Status) -> Attempt {
        if let Some(reason) = explain_tls(&status) {
            return Attempt::Fatal(ClusterError::Tls { chief: self.chief(), address: self.address.clone(), reason });
        }
        match status.code() {
            Code::Unauthenticated => {
                Attempt::Fatal(ClusterError::Unauthenticated { chief: self.chief(), address: self.address.clone() })
            }
            Code::FailedPrecondition | Code::InvalidArgument | Code::Unimplemented => {
                Attempt::Fatal(ClusterError::Protocol {
                    chief: self.chief(),
                    address: self.address.clone(),
                    message: status.message().to_owned(),
                })
            }
            _ => Attempt::Retry(status.message().to_owned()),
        }
    }

    fn lost(&self, cause: &str) -> Failure {
        let detail = format!(
            "the connection to it broke: the process exited, was killed, or the network \
             failed ({cause})"
        );
        Failure::Died { task: self.chief(), detail }
    }

    /// Checks in with the chief, retrying until `deadline`.
    pub(crate) async fn rendezvous(
        &self,
        request: pb::CheckInRequest,
        deadline: std::time::Instant,
    ) -> Result<Roster, ClusterError> {
        let s = &self.settings;
        let deadline = Instant::from_std(deadline);
        let mut missing = None;
        let mut last_error = "no answer".to_owned();
        let mut closing_since: Option<Instant> = None;
        loop {
            let attempt = self.check_in(request.clone(), &mut missing);
            match timeout_at(deadline, attempt).await {
                Ok(Ok(roster)) => return Ok(roster),
                Ok(Err(Attempt::Fatal(e))) => return Err(e),
                Ok(Err(Attempt::Retry(e))) => last_error = e,
                Err(_) => break,
            }
            // Something that is not trainrun may be answering at the chief's address (a web
            // server, a closed port forward): name it rather than retrying until the timeout.
            match self.probe(PROBE_WAIT).await {
                Some(answer @ (Answer::Http1(_) | Answer::Junk(_))) => return Err(self.stranger(&answer)),
                Some(answer @ Answer::Closed) => {
                    let since = *closing_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= CLOSED_LIMIT {
                        return Err(self.stranger(&answer));
                    }
                    last_error = answer.describe();
                }
                Some(answer @ Answer::Tls) if !self.tls => return Err(self.stranger(&answer)),
                Some(Answer::Silent | Answer::Http2 | Answer::Tls) | None => closing_since = None,
            }
            sleep_until((Instant::now() + RETRY).min(deadline)).await;
            if Instant::now() >= deadline {
                break;
            }
        }
        // A chief that never answered: say what, if anything, holds its address.
        let expected = |a: &Answer| *a == Answer::Http2 || (*a == Answer::Tls && self.tls);
        if let Some(answer) = self.probe(PROBE_WAIT).await.filter(|a| !expected(a)) {
            last_error = answer.describe();
        }
        let after = s.timeouts.startup;
        Err(match missing {
            Some(missing) => Failure::RendezvousTimeout { after, missing }.into(),
            None => {
                ClusterError::ChiefUnreachable { chief: self.chief(), address: self.address.clone(), after, last_error }
            }
        })
    }

    /// What answers at the chief's address, judged off the runtime's threads.
    async fn probe(&self, wait: Duration) -> Option<Answer> {
        let address = self.address.clone();
        tokio::task::spawn_blocking(move || stranger::probe(&address, wait)).await.ok().flatten()
    }

    fn stranger(&self, answer: &Answer) -> ClusterError {
        ClusterError::Stranger { chief: self.chief(), address: self.address.clone(), what: answer.describe() }
    }

    async fn check_in(
        &self,
        request: pb::CheckInRequest,
        missing: &mut Option<Vec<TaskId>>,
    ) -> Result<Roster, Attempt> {
        let fatal = |m| Attempt::Fatal(self.malformed(m));
        let mut client = self.client.clone();
        let response = client.check_in(request).await;
        let mut updates = response.map_err(|s| self.classify(s))?.into_inner();
        loop {
            let update = match updates.message().await {
                Ok(Some(u)) => u.update,
                Ok(None) => return Err(Attempt::Retry("the chief hung up".into())),
                Err(status) => return Err(self.classify(status)),
            };
            match update {
                Some(Update::Waiting(w)) => {
                    let tasks = w.missing.iter().map(|t| wire::task(t));
                    *missing = Some(tasks.collect::<Result<_, _>>().map_err(fatal)?);
                }
                Some(Update::Roster(r)) => return wire::roster(r).map_err(fatal),
                Some(Update::Failure(f)) => {
                    let f = wire::failure(f).map_err(fatal)?;
                    return Err(Attempt::Fatal(f.into()));
                }
                None => return Err(fatal(Malformed("an empty rendezvous update".into()))),
            }
        }
    }

    /// An RPC failed: if the heartbeat stream explains why within a moment, that is the error
    /// every task reports; otherwise the chief is gone.
    async fn explain(&self, status: Status) -> ClusterError {
        if status.code() == Code::Unauthenticated {
            return ClusterError::Unauthenticated { chief: self.chief(), address: self.address.clone() };
        }
        let wait = self.settings.timeouts.heartbeat * 2;
        match timeout(wait, self.local.failed()).await {
            Ok(f) => f.into(),
            Err(_) => self.lost(status.message()).into(),
        }
    }

    pub(crate) async fn barrier(&self, name: &str) -> Result<(), ClusterError> {
        let t = self.settings.timeouts;
        let request = pb::BarrierRequest { caller: Some(self.caller()), name: name.to_owned() };
        let mut client = self.client.clone();
        // The chief times barriers out itself; this bound only catches a chief that hangs.
        let limit = t.failure + t.heartbeat * 4;
        tokio::select! {
            reply = timeout(limit, client.barrier(request)) => match reply {
                Ok(Ok(reply)) => match reply.into_inner().failure {
                    None => Ok(()),
                    Some(f) => Err(wire::failure(f).map_err(|m| self.malformed(m))?.into()),
                },
                Ok(Err(status)) => Err(self.explain(status).await),
                Err(_) => Err(Failure::Silent { task: self.chief(), after: limit }.into()),
            },
            f = self.local.failed() => Err(f.into()),
        }
    }

    pub(crate) async fn send_metrics(&self, json: String) -> Result<(), ClusterError> {
        let request = pb::MetricsRecord { caller: Some(self.caller()), json };
        let mut client = self.client.clone();
        let limit = self.settings.timeouts.failure;
        match timeout(limit, client.send_metrics(request)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(status)) => Err(self.explain(status).await),
            Err(_) => Err(Failure::Silent { task: self.chief(), after: limit }.into()),
        }
    }

    /// Pings the chief until the job ends, recording what the chief says in `local`. `ready`
    /// fires at the first answer: from then on the chief watches this task's stream.
    pub(crate) async fn heartbeats(
        self: Arc<Self>,
        ready: oneshot::Sender<()>,
        mut control: mpsc::Receiver<HeartbeatControl>,
    ) {
        let t = self.settings.timeouts;
        let ping = |leaving, abort| pb::Ping {
            caller: Some(self.caller()),
            leaving,
            abort,
            step_times: self.local.clock.read().map(pb::StepTimes::from),
        };
        let (tx, rx) = mpsc::channel(8);
        // The chief reads the first ping before it answers the call.
        let _ = tx.try_send(ping(false, None));
        let mut client = self.client.clone();
        let mut pongs = match client.heartbeat(ReceiverStream::new(rx)).await {
            Ok(response) => response.into_inner(),
            Err(status) => {
                let failure = match self.explain(status).await {
                    ClusterError::Failed(f) => f,
                    other => self.lost(&other.to_string()),
                };
                self.local.fail(failure);
                return;
            }
        };
        let mut tick = tokio::time::interval(t.heartbeat);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // Its own timer rather than a check at each ping: in a large job pings are far apart
        // (see `plane::paced`), and a hung chief is still named within the failure timeout.
        let silence = sleep_until(Instant::now() + t.failure);
        tokio::pin!(silence);
        let mut leaving = false;
        let mut ready = Some(ready);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    // A full queue means the chief stopped reading; the silence timer catches it.
                    let _ = tx.try_send(ping(false, None));
                }
                () = &mut silence, if !leaving => {
                    self.local.fail(Failure::Silent { task: self.chief(), after: t.failure });
                    return;
                }
                message = pongs.message() => match message {
                    Ok(Some(pong)) => {
                        silence.as_mut().reset(Instant::now() + t.failure);
                        if let Some(ready) = ready.take() {
                            let _ = ready.send(());
                        }
                        if self.apply(pong) {
                            return;
                        }
                    }
                    Ok(None) | Err(_) if leaving => return,
                    Ok(None) => {
                        self.local.fail(self.lost("it ended the heartbeat stream"));
                        return;
                    }
                    Err(status) => {
                        self.local.fail(self.lost(status.message()));
                        return;
                    }
                },
                c = control.recv(), if !leaving => match c {
                    // The plane was dropped without `shutdown`: end the stream without a
                    // goodbye, so the chief reports this task's death.
                    None => return,
                    Some(HeartbeatControl::Leave) => {
                        leaving = true;
                        let _ = tx.send(ping(true, None)).await;
                    }
                    Some(HeartbeatControl::Abort(reason)) => {
                        let _ = tx.send(ping(false, Some(reason))).await;
                    }
                },
            }
        }
    }

    /// Records a pong; true when the stream is done (the job failed or finished).
    fn apply(&self, pong: pb::Pong) -> bool {
        let chief = self.chief();
        let garbled = |m: Malformed| Failure::Aborted {
            task: chief,
            reason: format!("it sent a message this task cannot read: {}", m.0),
        };
        for c in pong.commands {
            match wire::command_from(c) {
                Ok((seq, command)) => self.local.deliver(seq, command),
                Err(m) => {
                    self.local.fail(garbled(m));
                    return true;
                }
            }
        }
        if let Some(f) = pong.failure {
            self.local.fail(wire::failure(f).unwrap_or_else(garbled));
            return true;
        }
        if pong.finished {
            let reason = format!("the chief {chief} finished the job");
            self.local.push(Command::Stop { reason });
            return true;
        }
        false
    }
}
