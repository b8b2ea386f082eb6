//! exo's libp2p transport, as the Python module `exo_transport_libp2p._native`.
//!
//! Everything asynchronous returns an asyncio awaitable (pyo3-async-runtimes on its tokio
//! runtime, which is created on first use, so processes started with `spawn` get their own).
//! The Python class `exo_transport_libp2p.transport.Libp2pTransport` wraps this module into
//! the core's `Transport` interface; this layer stays small and typed by `_native.pyi`.

mod codec;
mod identity;
mod inbox;
mod node;
mod probe;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use libp2p::pnet::PreSharedKey;
use libp2p::{Multiaddr, PeerId};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};
use tokio::sync::{mpsc, oneshot};

use codec::Reply;
use inbox::{Inbox, Item};
use node::{Command, Control, Event, RequestError as NodeRequestError, Shared};

create_exception!(
    _native,
    NativeError,
    PyException,
    "The native transport failed."
);
create_exception!(
    _native,
    PayloadTooLargeError,
    NativeError,
    "A payload exceeds the channel's limit."
);
create_exception!(
    _native,
    RequestError,
    NativeError,
    "A request got no answer, or the remote handler failed."
);

/// Python awaitables whose Rust future has not finished yet (see `shutdown_all`).
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
/// Every node started in this process, to stop those still running at exit.
static NODES: Mutex<Vec<mpsc::WeakSender<Command>>> = Mutex::new(Vec::new());

struct InFlight;

impl InFlight {
    fn new() -> Self {
        IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
        InFlight
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    }
}

/// `future_into_py`, counting the future as in flight until it finishes or is dropped.
fn awaitable<'py, F, T>(py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    F: std::future::Future<Output = PyResult<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    let guard = InFlight::new();
    pyo3_async_runtimes::tokio::future_into_py(py, async move {
        let _guard = guard;
        fut.await
    })
}

/// Commands queued to the swarm before callers have to wait (publish falls back to waiting).
const COMMAND_QUEUE: usize = 4096;
/// Inbound requests held for the Python handlers before new ones are refused.
const PENDING_REQUESTS: usize = 1024;

/// A running libp2p node. Created by `start_node`.
#[pyclass(frozen, name = "Node", module = "exo_transport_libp2p._native")]
struct Node {
    commands: mpsc::Sender<Command>,
    shared: Arc<Shared>,
    /// The node's own runtime: its swarm, connections and mDNS tasks all run here, so
    /// shutting it down ends every one of them (libp2p-mdns would otherwise leave its
    /// interface tasks answering queries for a node that is gone).
    runtime: Arc<NodeRuntime>,
    peer_id: String,
    max_broadcast_size: usize,
    max_request_size: usize,
}

struct NodeRuntime(Mutex<Option<tokio::runtime::Runtime>>);

impl NodeRuntime {
    fn shutdown(&self) {
        if let Some(rt) = self.0.lock().unwrap_or_else(|e| e.into_inner()).take() {
            rt.shutdown_background();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.runtime.shutdown();
    }
}

fn closed() -> PyErr {
    NativeError::new_err("the node is stopped")
}

impl Node {
    fn check_broadcast(&self, payload: &[u8]) -> PyResult<()> {
        if payload.len() > self.max_broadcast_size {
            return Err(PayloadTooLargeError::new_err(format!(
                "a broadcast of {} bytes exceeds the limit of {} bytes; use a request instead",
                payload.len(),
                self.max_broadcast_size
            )));
        }
        Ok(())
    }
}

#[pymethods]
impl Node {
    /// This node's peer id.
    #[getter]
    fn peer_id(&self) -> String {
        self.peer_id.clone()
    }

    #[getter]
    fn max_broadcast_size(&self) -> usize {
        self.max_broadcast_size
    }

    #[getter]
    fn max_request_size(&self) -> usize {
        self.max_request_size
    }

    /// The addresses this node listens on, each ending in `/p2p/<peer id>`.
    fn listen_addrs(&self) -> Vec<String> {
        let addrs = self
            .shared
            .listen_addrs
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        addrs
            .iter()
            .map(|a| format!("{a}/p2p/{}", self.peer_id))
            .collect()
    }

    /// The peers connected now.
    fn peers(&self) -> Vec<String> {
        let peers = self.shared.peers.lock().unwrap_or_else(|e| e.into_inner());
        peers.iter().cloned().collect()
    }

    /// How many inbound broadcasts were dropped because Python read too slowly.
    fn dropped_total(&self) -> u64 {
        self.shared.events.dropped_total()
    }

    fn subscribe<'py>(&self, py: Python<'py>, topic: String) -> PyResult<Bound<'py, PyAny>> {
        let commands = self.commands.clone();
        awaitable(py, async move {
            let (tx, rx) = oneshot::channel();
            commands
                .send(Command::Subscribe(topic, tx))
                .await
                .map_err(|_| closed())?;
            rx.await
                .map_err(|_| closed())?
                .map_err(NativeError::new_err)
        })
    }

    fn unsubscribe(&self, topic: String) -> PyResult<()> {
        self.send_now(Command::Unsubscribe(topic))
    }

    /// Queue a broadcast without waiting; false when the command queue is full (then await
    /// `publish`). Raises `PayloadTooLargeError` above the broadcast limit.
    fn try_publish(&self, topic: String, payload: &[u8]) -> PyResult<bool> {
        self.check_broadcast(payload)?;
        match self
            .commands
            .try_send(Command::Publish(topic, payload.to_vec()))
        {
            Ok(()) => Ok(true),
            Err(mpsc::error::TrySendError::Full(_)) => Ok(false),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(closed()),
        }
    }

    /// Queue a broadcast, waiting for room in the command queue.
    fn publish<'py>(
        &self,
        py: Python<'py>,
        topic: String,
        payload: &[u8],
    ) -> PyResult<Bound<'py, PyAny>> {
        self.check_broadcast(payload)?;
        let command = Command::Publish(topic, payload.to_vec());
        let commands = self.commands.clone();
        awaitable(py, async move {
            commands.send(command).await.map_err(|_| closed())
        })
    }

    /// Send a request and return the answer's bytes. Raises `RequestError` on any failure.
    fn request<'py>(
        &self,
        py: Python<'py>,
        peer: &str,
        payload: &[u8],
        timeout: f64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let peer_id: PeerId = peer
            .parse()
            .map_err(|_| RequestError::new_err(format!("{peer:?} is not a peer id")))?;
        if payload.len() > self.max_request_size {
            return Err(PayloadTooLargeError::new_err(format!(
                "a request of {} bytes exceeds the limit of {} bytes",
                payload.len(),
                self.max_request_size
            )));
        }
        if peer_id.to_string() == self.peer_id {
            return Err(RequestError::new_err(
                "a node cannot send a request to itself",
            ));
        }
        let timeout = Duration::try_from_secs_f64(timeout.max(0.0))
            .map_err(|e| NativeError::new_err(e.to_string()))?;
        let payload = payload.to_vec();
        let commands = self.commands.clone();
        let peer = peer.to_owned();
        awaitable(py, async move {
            let (tx, rx) = oneshot::channel();
            let answer = tokio::time::timeout(timeout, async {
                commands
                    .send(Command::Request(peer_id, payload, tx))
                    .await
                    .map_err(|_| RequestError::new_err("the node is stopped"))?;
                match rx.await {
                    Ok(Ok(body)) => Ok(body),
                    Ok(Err(NodeRequestError::Remote(message))) => Err(RequestError::new_err(
                        format!("peer {peer} failed to answer: {message}"),
                    )),
                    Ok(Err(NodeRequestError::Failed(message))) => Err(RequestError::new_err(
                        format!("request to {peer} failed: {message}"),
                    )),
                    Err(_) => Err(RequestError::new_err("the node is stopped")),
                }
            })
            .await
            .map_err(|_| {
                RequestError::new_err(format!(
                    "request to {peer} timed out after {}s",
                    timeout.as_secs_f64()
                ))
            })??;
            Ok(Python::attach(|py| PyBytes::new(py, &answer).unbind()))
        })
    }

    /// Answer inbound request `request_id`: with `payload` when `ok`, else with an error
    /// whose message is `payload` (UTF-8).
    fn respond(&self, request_id: u64, ok: bool, payload: &[u8]) -> PyResult<()> {
        let reply = if !ok {
            Reply::Err(String::from_utf8_lossy(payload).into_owned())
        } else if payload.len() > self.max_request_size {
            Reply::Err(format!(
                "the response of {} bytes exceeds the limit of {} bytes",
                payload.len(),
                self.max_request_size
            ))
        } else {
            Reply::Ok(payload.to_vec())
        };
        self.send_now(Command::Respond(request_id, reply))
    }

    /// Also dial `addr` now and whenever it is disconnected, like a bootstrap peer.
    fn add_bootstrap_peer(&self, addr: &str) -> PyResult<()> {
        let addr: Multiaddr = addr
            .parse()
            .map_err(|e| NativeError::new_err(format!("bad multiaddr {addr:?}: {e}")))?;
        self.send_now(Command::AddBootstrap(addr))
    }

    /// Wait for what arrived and return up to `max` events as tuples:
    /// `("message", topic, sender, payload)`, `("connected", peer)`,
    /// `("disconnected", peer)`, `("lagged", dropped)`; `None` once the node stopped.
    fn next_events<'py>(&self, py: Python<'py>, max: usize) -> PyResult<Bound<'py, PyAny>> {
        let shared = self.shared.clone();
        awaitable(py, async move {
            let Some(batch) = shared.events.pop_batch(max).await else {
                return Ok(None);
            };
            Python::attach(|py| {
                let items = batch
                    .into_iter()
                    .map(|item| event_tuple(py, item))
                    .collect::<PyResult<Vec<_>>>()?;
                Ok(Some(PyList::new(py, items)?.unbind()))
            })
        })
    }

    /// Like `next_events`, for what the transport handles itself:
    /// `("request", id, peer, payload)`, `("duplicate_identity", address, dialer)`,
    /// `("notice", level, message)`.
    fn next_control<'py>(&self, py: Python<'py>, max: usize) -> PyResult<Bound<'py, PyAny>> {
        let shared = self.shared.clone();
        awaitable(py, async move {
            let Some(batch) = shared.control.pop_batch(max).await else {
                return Ok(None);
            };
            Python::attach(|py| {
                let items = batch
                    .into_iter()
                    .filter_map(|item| match item {
                        Item::Value(c) => Some(control_tuple(py, c)),
                        Item::Lagged(_) => None, // the control queue never lags
                    })
                    .collect::<PyResult<Vec<_>>>()?;
                Ok(Some(PyList::new(py, items)?.unbind()))
            })
        })
    }

    /// Close every connection and stop the swarm; the event queues then end.
    fn stop<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let commands = self.commands.clone();
        let runtime = self.runtime.clone();
        awaitable(py, async move {
            let (tx, rx) = oneshot::channel();
            if commands.send(Command::Stop(tx)).await.is_ok() {
                let _ = rx.await;
            }
            runtime.shutdown();
            Ok(())
        })
    }

    fn __repr__(&self) -> String {
        format!("<Node {}>", self.peer_id)
    }
}

impl Node {
    /// Queue a command from synchronous code: at once when there is room, else from a task.
    fn send_now(&self, command: Command) -> PyResult<()> {
        match self.commands.try_send(command) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(command)) => {
                let commands = self.commands.clone();
                pyo3_async_runtimes::tokio::get_runtime().spawn(async move {
                    let _ = commands.send(command).await;
                });
                Ok(())
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Err(closed()),
        }
    }
}

fn event_tuple(py: Python<'_>, item: Item<Event>) -> PyResult<Bound<'_, PyTuple>> {
    match item {
        Item::Value(Event::Message {
            topic,
            sender,
            payload,
        }) => ("message", topic, sender, PyBytes::new(py, &payload)).into_pyobject(py),
        Item::Value(Event::Connected(peer)) => ("connected", peer).into_pyobject(py),
        Item::Value(Event::Disconnected(peer)) => ("disconnected", peer).into_pyobject(py),
        Item::Lagged(n) => ("lagged", n).into_pyobject(py),
    }
}

fn control_tuple(py: Python<'_>, control: Control) -> PyResult<Bound<'_, PyTuple>> {
    match control {
        Control::Request { id, peer, payload } => {
            ("request", id, peer, PyBytes::new(py, &payload)).into_pyobject(py)
        }
        Control::DuplicateIdentity { address, dialer } => {
            ("duplicate_identity", address, dialer).into_pyobject(py)
        }
        Control::Notice { level, message } => ("notice", level, message).into_pyobject(py),
    }
}

/// Start a node and return it once it listens.
#[pyfunction]
#[pyo3(signature = (
    key_path, network_key, listen_host = "0.0.0.0".to_owned(), port = 0, bootstrap_peers = vec![],
    mdns = true, max_broadcast_size = 1 << 20, max_request_size = 64 << 20,
    inbox_capacity = 8192,
))]
#[allow(clippy::too_many_arguments)]
fn start_node<'py>(
    py: Python<'py>,
    key_path: PathBuf,
    network_key: Vec<u8>,
    listen_host: String,
    port: u16,
    bootstrap_peers: Vec<String>,
    mdns: bool,
    max_broadcast_size: usize,
    max_request_size: usize,
    inbox_capacity: usize,
) -> PyResult<Bound<'py, PyAny>> {
    let key = identity::load_or_create(&key_path).map_err(NativeError::new_err)?;
    let bootstrap = parse_addrs(&bootstrap_peers)?;
    let peer_id = key.public().to_peer_id().to_string();
    let config = node::Config {
        key,
        network_key: pre_shared_key(&network_key)?,
        listen_host,
        port,
        bootstrap,
        mdns,
        max_broadcast_size,
        max_request_size,
        inbox_capacity,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("exo-libp2p")
        .enable_all()
        .build()
        .map_err(|e| NativeError::new_err(format!("cannot start a tokio runtime: {e}")))?;
    let handle = runtime.handle().clone();
    let runtime = Arc::new(NodeRuntime(Mutex::new(Some(runtime))));
    awaitable(py, async move {
        let shared = Arc::new(Shared {
            events: Inbox::new(config.inbox_capacity),
            control: Inbox::new(PENDING_REQUESTS),
            peers: Mutex::new(BTreeSet::new()),
            listen_addrs: Mutex::new(Vec::new()),
        });
        let (commands, receiver) = mpsc::channel(COMMAND_QUEUE);
        let started = handle
            .spawn(node::start(config, shared.clone(), receiver))
            .await
            .map_err(|e| NativeError::new_err(format!("the node failed to start: {e}")))
            .and_then(|r| r.map_err(NativeError::new_err));
        if let Err(e) = started {
            runtime.shutdown();
            return Err(e);
        }
        NODES
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(commands.downgrade());
        Ok(Node {
            commands,
            shared,
            runtime,
            peer_id,
            max_broadcast_size,
            max_request_size,
        })
    })
}

/// The peer id of the key at `key_path`, creating the key (mode 0600) if the file is missing.
#[pyfunction]
fn load_or_create_key(key_path: PathBuf) -> PyResult<String> {
    let key = identity::load_or_create(&key_path).map_err(NativeError::new_err)?;
    Ok(key.public().to_peer_id().to_string())
}

/// Addresses among `addrs` where another running node presents the identity stored at
/// `key_path` (a copied data directory). Blocks, with the GIL released, at most `timeout` s.
#[pyfunction]
#[pyo3(signature = (key_path, network_key, addrs, timeout = 2.0))]
fn find_identity_clones(
    py: Python<'_>,
    key_path: PathBuf,
    network_key: Vec<u8>,
    addrs: Vec<String>,
    timeout: f64,
) -> PyResult<Vec<String>> {
    let key = identity::load_or_create(&key_path).map_err(NativeError::new_err)?;
    let addrs = parse_addrs(&addrs)?;
    let psk = pre_shared_key(&network_key)?;
    let timeout = Duration::try_from_secs_f64(timeout.max(0.0))
        .map_err(|e| NativeError::new_err(e.to_string()))?;
    py.detach(|| {
        // A private runtime: this may run before any node exists, and outside any loop.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| NativeError::new_err(format!("cannot start a tokio runtime: {e}")))?;
        let found = runtime.block_on(probe::find_clones(&key, psk, addrs, timeout));
        runtime.shutdown_background();
        Ok(found)
    })
}

/// The private network's key: exactly 32 bytes.
fn pre_shared_key(bytes: &[u8]) -> PyResult<PreSharedKey> {
    let key: [u8; 32] = bytes.try_into().map_err(|_| {
        NativeError::new_err(format!("a network key has 32 bytes, not {}", bytes.len()))
    })?;
    Ok(PreSharedKey::new(key))
}

fn parse_addrs(addrs: &[String]) -> PyResult<Vec<Multiaddr>> {
    addrs
        .iter()
        .map(|a| {
            a.parse::<Multiaddr>()
                .map_err(|e| NativeError::new_err(format!("bad multiaddr {a:?}: {e}")))
        })
        .collect()
}

/// Replace the key at `key_path` with a fresh one and return its peer id.
#[pyfunction]
fn regenerate_key(key_path: PathBuf) -> PyResult<String> {
    let key = identity::regenerate(&key_path).map_err(NativeError::new_err)?;
    Ok(key.public().to_peer_id().to_string())
}

/// Stop every node still running and let in-flight awaitables settle, with the GIL released.
///
/// Registered with `atexit` by the Python package: a tokio thread that completes an awaitable
/// must take the GIL, and taking it while the interpreter finalizes aborts the process. Waits
/// at most `timeout` seconds.
#[pyfunction]
#[pyo3(signature = (timeout = 2.0))]
fn shutdown_all(py: Python<'_>, timeout: f64) {
    py.detach(|| {
        let deadline = std::time::Instant::now() + Duration::from_secs_f64(timeout.max(0.0));
        let nodes: Vec<_> = NODES
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .filter_map(|weak| weak.upgrade())
            .collect();
        let mut stopping = Vec::new();
        for commands in nodes {
            let (tx, rx) = oneshot::channel();
            if commands.try_send(Command::Stop(tx)).is_ok() {
                stopping.push(rx);
            }
        }
        let wait = |done: &mut dyn FnMut() -> bool| {
            while !done() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        for mut rx in stopping {
            wait(&mut || !matches!(rx.try_recv(), Err(oneshot::error::TryRecvError::Empty)));
        }
        wait(&mut || IN_FLIGHT.load(Ordering::SeqCst) == 0);
        // The last completions take the GIL right after their future ends.
        std::thread::sleep(Duration::from_millis(20));
    });
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Node>()?;
    m.add_function(wrap_pyfunction!(start_node, m)?)?;
    m.add_function(wrap_pyfunction!(load_or_create_key, m)?)?;
    m.add_function(wrap_pyfunction!(regenerate_key, m)?)?;
    m.add_function(wrap_pyfunction!(shutdown_all, m)?)?;
    m.add_function(wrap_pyfunction!(find_identity_clones, m)?)?;
    m.add("NativeError", m.py().get_type::<NativeError>())?;
    m.add(
        "PayloadTooLargeError",
        m.py().get_type::<PayloadTooLargeError>(),
    )?;
    m.add("RequestError", m.py().get_type::<RequestError>())?;
    Ok(())
}
