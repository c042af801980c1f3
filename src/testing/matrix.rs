//! [`CrashMatrix`]: one call of a user's tool, crashed at every
//! [`CrashPoint`], restarted, and checked against the user's ledger.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use idem_runtime::{
    Class, Ctx, Error, Resolution, Runtime, RuntimeBuilder, ToolDescriptor, ToolError,
};

use super::clock::PausedClock;
use super::journal::{Fault, FaultJournal};
use super::point::CrashPoint;

/// The ground truth of a fake provider: how many times the effect of the
/// call under test really happened (charges made, emails sent), whatever
/// the journal says. Implemented for closures `Fn() -> usize`.
pub trait Ledger {
    /// How many times the effect happened so far.
    fn effects(&self) -> usize;
}

impl<F: Fn() -> usize> Ledger for F {
    fn effects(&self) -> usize {
        self()
    }
}

/// Why [`CrashMatrix::new`] refused a tool.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MatrixError {
    /// No `#[tool]` of this name is linked into the binary.
    UnknownTool {
        /// The name asked for.
        name: String,
    },
    /// A `read_only` tool writes no journal: there is nothing to crash.
    ReadOnly {
        /// The tool.
        name: String,
    },
}

impl fmt::Display for MatrixError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MatrixError::UnknownTool { name } => write!(
                f,
                "no #[tool] named {name:?} is linked into this binary (idem::tools() lists them; \
                 a method tool is named Type::method)"
            ),
            MatrixError::ReadOnly { name } => write!(
                f,
                "tool {name:?} is read_only: it writes no journal, so it has no crash points"
            ),
        }
    }
}

impl std::error::Error for MatrixError {}

/// A promise of the tool's class that a crash broke (see
/// [`PointReport::violation`]).
#[derive(Debug)]
#[non_exhaustive]
pub enum Violation {
    /// The call returned before it reached the crash point (it journals
    /// nothing there), so the point was not tested. The matrix tests a
    /// call that succeeds: one that fails (a semantic refusal is settled
    /// like a COMMIT, so it still meets every point) is reported
    /// [`Violation::Failed`].
    NotReached {
        /// What the call returned (`Debug`).
        returned: String,
    },
    /// The effect happened more than once.
    Duplicated {
        /// How many times, by the ledger.
        count: usize,
    },
    /// The call returned a result after its restart, but the effect never
    /// happened.
    Lost,
    /// An `at_most_once` call that the crash left in doubt (its INTENT
    /// durable, no COMMIT) was not parked for a human after the restart.
    NotParked {
        /// What the restarted call returned (`Debug`).
        returned: String,
    },
    /// The effect happened again between the restart and the human's
    /// decision: the call re-ran where it had to wait for a human.
    RanWithoutHuman {
        /// Effects when the process died.
        at_crash: usize,
        /// Effects when the human was asked.
        at_escalation: usize,
    },
    /// After the restart (and the human's decision, if it was parked) the
    /// call did not return its result.
    Failed {
        /// The error (`Debug`).
        error: String,
    },
    /// The call neither finished nor reached the crash point within two
    /// days of (paused) tokio time.
    Stuck {
        /// Which call: `before the crash` or `after the restart`.
        stage: &'static str,
    },
    /// The runtime could not be opened, or the human's decision could not
    /// be recorded.
    Journal(Error),
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::NotReached { returned } => write!(
                f,
                "the call returned {returned} before it reached the crash point, which was \
                 therefore not tested (does the fake provider answer Ok?)"
            ),
            Violation::Duplicated { count } => {
                write!(f, "the effect happened {count} times (ledger)")
            }
            Violation::Lost => f.write_str(
                "the call returned a result after the restart, but the effect never happened \
                 (ledger: 0)",
            ),
            Violation::NotParked { returned } => write!(
                f,
                "the restarted call returned {returned} instead of parking the operation for a \
                 human"
            ),
            Violation::RanWithoutHuman {
                at_crash,
                at_escalation,
            } => write!(
                f,
                "the effect count went from {at_crash} at the crash to {at_escalation} before a \
                 human decided"
            ),
            Violation::Failed { error } => write!(f, "the call did not return its result: {error}"),
            Violation::Stuck { stage } => write!(f, "the call {stage} never finished"),
            Violation::Journal(_) => f.write_str("the journal failed"),
        }
    }
}

impl std::error::Error for Violation {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Violation::Journal(e) => Some(e),
            _ => None,
        }
    }
}

/// How the restarted call was parked, and how the matrix's "human"
/// settled it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Parked {
    /// The escalation's reason.
    pub reason: String,
    /// The human's decision: `landed` when the ledger shows the effect,
    /// else `reissue`.
    pub resolution: &'static str,
    /// The ledger's count when the human looked.
    pub effects: usize,
}

/// What happened at one crash point.
#[derive(Debug)]
#[non_exhaustive]
pub struct PointReport {
    /// The tool.
    pub tool: &'static str,
    /// Its class.
    pub class: Class,
    /// Where the first process died.
    pub point: CrashPoint,
    /// The ledger's count when it died.
    pub effects_at_crash: usize,
    /// The ledger's count at the end.
    pub effects: usize,
    /// Whether the restarted call was parked for a human, and how it was
    /// settled.
    pub parked: Option<Parked>,
    /// What the last call returned (`Debug`).
    pub outcome: String,
    /// The promise broken, if one was.
    pub violation: Option<Violation>,
}

impl PointReport {
    /// Whether the class's promise held at this point.
    pub fn holds(&self) -> bool {
        self.violation.is_none()
    }
}

/// What the class promises, for messages.
fn promise(tool: &ToolDescriptor) -> &'static str {
    match (tool.class, tool.verify) {
        (Class::Provider, _) => {
            "exactly once, without a human: the provider deduplicates on ctx.idempotency_key()"
        }
        (Class::Journal, Some("none")) | (Class::Journal, None) => {
            "at most once; what it cannot know is parked for a human"
        }
        (Class::Journal, Some(_)) => {
            "exactly once: after a crash, verify tells whether the effect landed"
        }
        (Class::AtMostOnce, _) => {
            "at most once: an operation in doubt is parked for a human, never re-run"
        }
        _ => "nothing (it journals nothing)",
    }
}

impl fmt::Display for PointReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "crash point {}, class {} (tool `{}`): ",
            self.point,
            self.class.as_str(),
            self.tool
        )?;
        match &self.violation {
            None => write!(f, "held (effects: {}", self.effects)?,
            Some(v) => write!(f, "BROKEN: {v} (effects: {}", self.effects)?,
        }
        if let Some(p) = &self.parked {
            write!(f, "; parked, settled `{}`", p.resolution)?;
        }
        write!(f, "; last call returned {})", self.outcome)?;
        if let Some(Violation::Journal(e)) = &self.violation {
            write!(f, ": {e}")?;
        }
        Ok(())
    }
}

/// The reports of every crash point of one [`CrashMatrix::run`].
#[derive(Debug)]
#[non_exhaustive]
pub struct MatrixReport {
    /// The tool.
    pub tool: &'static str,
    /// Its class.
    pub class: Class,
    /// What the class promises, in words.
    pub promise: &'static str,
    /// One report per crash point, in the order run.
    pub points: Vec<PointReport>,
}

impl MatrixReport {
    /// Whether the promise held at every point.
    pub fn holds(&self) -> bool {
        self.points.iter().all(PointReport::holds)
    }

    /// The points where it broke.
    pub fn violations(&self) -> impl Iterator<Item = &PointReport> {
        self.points.iter().filter(|p| !p.holds())
    }

    /// The report of one point, if it was run.
    pub fn point(&self, point: CrashPoint) -> Option<&PointReport> {
        self.points.iter().find(|p| p.point == point)
    }

    /// Panics, with every broken point, unless the promise held
    /// everywhere.
    #[track_caller]
    pub fn assert_holds(&self) {
        if !self.holds() {
            panic!("{self}");
        }
    }
}

impl fmt::Display for MatrixReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let broken = self.violations().count();
        write!(
            f,
            "crash matrix of `{}` (class {}, promise: {}): ",
            self.tool,
            self.class.as_str(),
            self.promise
        )?;
        if broken == 0 {
            write!(f, "held at all {} crash points", self.points.len())?;
        } else {
            write!(
                f,
                "BROKEN at {broken} of {} crash points",
                self.points.len()
            )?;
        }
        for p in &self.points {
            write!(f, "\n  {p}")?;
        }
        Ok(())
    }
}

type Configure = Box<dyn Fn(RuntimeBuilder) -> RuntimeBuilder>;

/// Runs one call of a tool once per [`CrashPoint`]: each time in a fresh
/// world (the user's fake provider, a fresh [`FaultJournal`], a
/// [`PausedClock`]), the process dies at the point (its runtime and call
/// are dropped; what no barrier covered is lost), a new process restarts
/// on what is durable and makes the same call again. When the restarted
/// call is parked for a human, the matrix plays the human: it looks at the
/// ledger, resolves `Landed` if the effect happened and `Reissue` if not,
/// and calls again. Then it checks the class's promise:
///
/// - every class: the effect happened exactly once (never twice, and not
///   zero times when the call returned its result), and the call returned
///   its result in the end;
/// - `at_most_once`: a crash that left the operation in doubt
///   ([`AfterIntent`](CrashPoint::AfterIntent),
///   [`AfterProvider`](CrashPoint::AfterProvider)) parks it, and nothing
///   runs before the human decides.
///
/// A broken promise is reported per point, naming the point, the class
/// and what went wrong ([`MatrixReport::assert_holds`] panics with it).
///
/// ```
/// use idem::testing::{CrashMatrix, Ledger};
/// use idem::{tool, Classify, Ctx, Failure};
/// use std::collections::HashSet;
/// use std::sync::{Arc, Mutex};
///
/// /// A fake payments API that deduplicates on the idempotency key.
/// #[derive(Clone, Default)]
/// struct FakePayments {
///     keys: Arc<Mutex<HashSet<String>>>,
///     charges: Arc<Mutex<u32>>,
/// }
///
/// impl FakePayments {
///     fn charge(&self, key: &str) {
///         if self.keys.lock().unwrap().insert(key.to_string()) {
///             *self.charges.lock().unwrap() += 1;
///         }
///     }
/// }
///
/// impl Ledger for FakePayments {
///     fn effects(&self) -> usize {
///         *self.charges.lock().unwrap() as usize
///     }
/// }
///
/// #[derive(Debug)]
/// struct Declined;
/// impl Classify for Declined {
///     fn classify(&self) -> Failure {
///         Failure::Semantic
///     }
/// }
///
/// #[tool(class = "provider", key = "order")]
/// async fn charge(ctx: &Ctx, payments: FakePayments, order: u64) -> Result<u64, Declined> {
///     payments.charge(ctx.idempotency_key().as_str());
///     Ok(order)
/// }
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// // In a #[tokio::test(start_paused = true)]:
/// let report = CrashMatrix::new("charge")
///     .unwrap()
///     .run(FakePayments::default, async |payments, ctx| {
///         charge(ctx, payments.clone(), 4711).await
///     })
///     .await;
/// report.assert_holds();
/// # }
/// ```
pub struct CrashMatrix {
    tool: &'static ToolDescriptor,
    points: Vec<CrashPoint>,
    run_id: String,
    landed: Option<serde_json::Value>,
    configure: Option<Configure>,
}

impl fmt::Debug for CrashMatrix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CrashMatrix")
            .field("tool", &self.tool.name)
            .field("points", &self.points)
            .field("run_id", &self.run_id)
            .field("landed", &self.landed)
            .finish_non_exhaustive()
    }
}

/// How long (tokio time) one call may take before it counts as stuck.
const STUCK: Duration = Duration::from_secs(2 * 24 * 3600);

enum First<R> {
    Returned(R),
    Halted,
}

impl CrashMatrix {
    /// The matrix of the `#[tool]` named `tool` (as [`idem::tools()`](crate::tools)
    /// lists it: the function's name, `Type::method`, or its `name = ".."`),
    /// over every crash point.
    pub fn new(tool: &str) -> Result<CrashMatrix, MatrixError> {
        let Some(descriptor) = idem_runtime::tools().find(|t| t.name == tool) else {
            return Err(MatrixError::UnknownTool { name: tool.into() });
        };
        if descriptor.class == Class::ReadOnly {
            return Err(MatrixError::ReadOnly { name: tool.into() });
        }
        Ok(CrashMatrix {
            tool: descriptor,
            points: CrashPoint::ALL.to_vec(),
            run_id: "crash-matrix".into(),
            landed: None,
            configure: None,
        })
    }

    /// Only these crash points, in this order.
    pub fn points(mut self, points: impl IntoIterator<Item = CrashPoint>) -> CrashMatrix {
        self.points = points.into_iter().collect();
        self
    }

    /// The root run of the call's context (default `crash-matrix`).
    pub fn run_id(mut self, id: impl Into<String>) -> CrashMatrix {
        self.run_id = id.into();
        self
    }

    /// The result the human records (`Resolution::Landed`) when a parked
    /// operation's effect did happen: it must deserialize into the tool's
    /// result type (default: `null`, for `()` and `Option` results).
    pub fn landed_result(mut self, result: serde_json::Value) -> CrashMatrix {
        self.landed = Some(result);
        self
    }

    /// Changes the runtime of each process before it opens (its retention,
    /// in-flight wait, worker id, ...). The matrix has set the journal, the
    /// clock and a seed: leave those.
    pub fn runtime(
        mut self,
        configure: impl Fn(RuntimeBuilder) -> RuntimeBuilder + 'static,
    ) -> CrashMatrix {
        self.configure = Some(Box::new(configure));
        self
    }

    /// Runs the matrix. `world` makes a fresh fake provider for each crash
    /// point (its [`Ledger`] counts that point's effects); `call` makes the
    /// call under test on it, under the context of the process (called
    /// once per process, and again after a human's decision).
    pub async fn run<L, T, E, W, C>(&self, world: W, call: C) -> MatrixReport
    where
        L: Ledger,
        T: fmt::Debug,
        E: fmt::Debug,
        W: Fn() -> L,
        C: AsyncFn(&L, &Ctx) -> Result<T, ToolError<E>>,
    {
        let mut points = Vec::new();
        for &point in &self.points {
            points.push(self.one(point, world(), &call).await);
        }
        MatrixReport {
            tool: self.tool.name,
            class: self.tool.class,
            promise: promise(self.tool),
            points,
        }
    }

    fn open(&self, journal: &Arc<FaultJournal>, clock: &PausedClock) -> Result<Runtime, Error> {
        let builder = Runtime::builder()
            .journal(journal.clone())
            .clock(Arc::new(clock.clone()))
            .seed(0);
        match &self.configure {
            Some(configure) => configure(builder).open(),
            None => builder.open(),
        }
    }

    async fn one<L, T, E, C>(&self, point: CrashPoint, ledger: L, call: &C) -> PointReport
    where
        L: Ledger,
        T: fmt::Debug,
        E: fmt::Debug,
        C: AsyncFn(&L, &Ctx) -> Result<T, ToolError<E>>,
    {
        let mut report = PointReport {
            tool: self.tool.name,
            class: self.tool.class,
            point,
            effects_at_crash: 0,
            effects: 0,
            parked: None,
            outcome: String::new(),
            violation: None,
        };
        let clock = PausedClock::default();
        let journal = FaultJournal::new();
        journal.inject(Fault::CrashAt(point));
        // The first process: runs the call until it dies at the point.
        {
            let rt = match self.open(&journal, &clock) {
                Ok(rt) => rt,
                Err(e) => return report.broken(Violation::Journal(e)),
            };
            let ctx = rt.run(&self.run_id);
            let first =
                tokio::time::timeout(STUCK, race(call(&ledger, &ctx), journal.halted())).await;
            match first {
                Err(_) => {
                    return report.broken(Violation::Stuck {
                        stage: "before the crash",
                    })
                }
                Ok(First::Returned(returned)) => {
                    report.outcome = format!("{returned:?}");
                    report.effects = ledger.effects();
                    return report.broken(Violation::NotReached {
                        returned: format!("{returned:?}"),
                    });
                }
                Ok(First::Halted) => {}
            }
            // The call, its context and the runtime die here.
        }
        report.effects_at_crash = ledger.effects();
        // The next process, on what survived.
        let journal = journal.restart();
        let rt = match self.open(&journal, &clock) {
            Ok(rt) => rt,
            Err(e) => return report.broken(Violation::Journal(e)),
        };
        let ctx = rt.run(&self.run_id);
        let mut result = match tokio::time::timeout(STUCK, call(&ledger, &ctx)).await {
            Ok(r) => r,
            Err(_) => {
                return report.broken(Violation::Stuck {
                    stage: "after the restart",
                })
            }
        };
        let restarted = format!("{result:?}");
        // The human, as often as the operation is parked (a reissued one
        // may be parked again).
        for _ in 0..3 {
            let Err(ToolError::Escalated { key, reason }) = &result else {
                break;
            };
            let effects = ledger.effects();
            let resolution = if effects > 0 {
                Resolution::Landed(self.landed.clone())
            } else {
                Resolution::Reissue
            };
            if report.parked.is_none() {
                report.parked = Some(Parked {
                    reason: reason.clone(),
                    resolution: resolution.label(),
                    effects,
                });
            }
            let note = "settled by idem::testing::CrashMatrix from the ledger";
            if let Err(e) = rt.resolve(key, resolution, note).await {
                report.outcome = format!("{result:?}");
                return report.broken(Violation::Journal(e));
            }
            result = match tokio::time::timeout(STUCK, call(&ledger, &ctx)).await {
                Ok(r) => r,
                Err(_) => {
                    return report.broken(Violation::Stuck {
                        stage: "after the human's decision",
                    })
                }
            };
        }
        report.effects = ledger.effects();
        report.outcome = format!("{result:?}");
        let in_doubt = matches!(point, CrashPoint::AfterIntent | CrashPoint::AfterProvider);
        let violation = if report.effects > 1 {
            Some(Violation::Duplicated {
                count: report.effects,
            })
        } else if self.tool.class == Class::AtMostOnce && in_doubt && report.parked.is_none() {
            Some(Violation::NotParked {
                returned: restarted,
            })
        } else if let Some(p) = report.parked.as_ref().filter(|p| {
            self.tool.class == Class::AtMostOnce && p.effects != report.effects_at_crash
        }) {
            Some(Violation::RanWithoutHuman {
                at_crash: report.effects_at_crash,
                at_escalation: p.effects,
            })
        } else if result.is_err() {
            Some(Violation::Failed {
                error: report.outcome.clone(),
            })
        } else if report.effects == 0 {
            Some(Violation::Lost)
        } else {
            None
        };
        report.violation = violation;
        report
    }
}

impl PointReport {
    fn broken(mut self, violation: Violation) -> PointReport {
        self.violation = Some(violation);
        self
    }
}

/// The call, or the crash, whichever comes first.
async fn race<R>(
    call: impl Future<Output = R>,
    halted: impl Future<Output = CrashPoint>,
) -> First<R> {
    let mut call = std::pin::pin!(call);
    let mut halted = std::pin::pin!(halted);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(r) = call.as_mut().poll(cx) {
            return Poll::Ready(First::Returned(r));
        }
        if halted.as_mut().poll(cx).is_ready() {
            return Poll::Ready(First::Halted);
        }
        Poll::Pending
    })
    .await
}
