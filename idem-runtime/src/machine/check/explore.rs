//! Breadth-first exploration of every world reachable within a depth, each
//! checked against the invariants; a violation is reported with the trace
//! that reaches it, replayed from the start.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};

use idem_journal::class::Class;
use idem_journal::journal::Durability;

use super::world::{Config, Move, Sharing, Violation, World};

/// What an exploration found.
#[derive(Debug, Default)]
pub struct Report {
    /// Worlds reached (distinct).
    pub states: u64,
    /// Violations, each with its trace.
    pub violations: Vec<String>,
    /// Configurations explored.
    pub configs: usize,
    /// Whether some exploration stopped at the depth bound.
    pub bounded: bool,
}

/// Two independent 64-bit hashes of a world: its fingerprint.
fn fingerprint(w: &World) -> u128 {
    // Fixed keys: a run is the same run every time.
    let a = std::hash::BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default();
    let mut h1 = a.build_hasher();
    0x9e37_79b9_u32.hash(&mut h1);
    w.hash(&mut h1);
    let mut h2 = a.build_hasher();
    0x85eb_ca6b_u32.hash(&mut h2);
    w.hash(&mut h2);
    ((h1.finish() as u128) << 64) | h2.finish() as u128
}

/// Explores `config` to `depth` moves.
///
/// Besides the invariants of each world, checks that no world is without a
/// way out: from every world explored, some end (a world where nothing can
/// happen any more) or some world cut off by the depth bound is reachable.
/// A world from which every path loops back (a driver that reads, waits
/// or retries forever) is a wedge, though each of its moves is legal.
pub fn explore(config: &Config, depth: usize, report: &mut Report) {
    report.configs += 1;
    let start = World::new(config);
    let mut seen: HashMap<u128, u32> = HashMap::new();
    seen.insert(fingerprint(&start), 0);
    // Every world reached: its parent's index and which successor it was.
    let mut parents: Vec<(u32, u16)> = vec![(u32::MAX, 0)];
    // The successors of every world expanded (`None`: not expanded, cut
    // off by the bound or by a violation).
    let mut moves: Vec<Option<Vec<u32>>> = vec![None];
    let mut frontier: Vec<(u32, World)> = vec![(0, start)];
    let mut stopped = false;
    for _ in 0..depth {
        let mut next = Vec::new();
        for (index, world) in frontier {
            let successors = match world.successors(config) {
                Ok(s) => s,
                Err(Violation(why)) => {
                    report
                        .violations
                        .push(trace(config, &parents, index, None, &why));
                    continue;
                }
            };
            if successors.is_empty() {
                if let Err(Violation(why)) = world.check_end() {
                    report
                        .violations
                        .push(trace(config, &parents, index, None, &why));
                }
                moves[index as usize] = Some(Vec::new());
                continue;
            }
            let mut to = Vec::with_capacity(successors.len());
            for (k, (_, w)) in successors.into_iter().enumerate() {
                let fp = fingerprint(&w);
                let i = *seen.entry(fp).or_insert_with(|| {
                    let i = parents.len() as u32;
                    parents.push((index, k as u16));
                    moves.push(None);
                    next.push((i, w));
                    i
                });
                to.push(i);
            }
            moves[index as usize] = Some(to);
            if report.violations.len() >= 5 {
                stopped = true;
                break;
            }
        }
        if stopped || next.is_empty() {
            break;
        }
        frontier = next;
    }
    if !stopped && report.violations.is_empty() {
        if let Some(wedged) = without_a_way_out(&moves) {
            report.violations.push(trace(
                config,
                &parents,
                wedged,
                None,
                "no way out: every path from here loops back (a wedge)",
            ));
        }
    }
    report.bounded |= moves.iter().any(Option::is_none);
    report.states += seen.len() as u64;
}

/// The first world from which no end and no world cut off by the bound
/// can be reached, if there is one.
fn without_a_way_out(moves: &[Option<Vec<u32>>]) -> Option<u32> {
    let mut back: Vec<Vec<u32>> = vec![Vec::new(); moves.len()];
    for (from, to) in moves.iter().enumerate() {
        for &t in to.iter().flatten() {
            back[t as usize].push(from as u32);
        }
    }
    // Ends and unexpanded worlds are ways out; so is every world that
    // reaches one.
    let mut out: Vec<bool> = moves
        .iter()
        .map(|m| m.as_ref().is_none_or(Vec::is_empty))
        .collect();
    let mut queue: Vec<u32> = (0..moves.len() as u32)
        .filter(|&i| out[i as usize])
        .collect();
    while let Some(i) = queue.pop() {
        for &p in &back[i as usize] {
            if !out[p as usize] {
                out[p as usize] = true;
                queue.push(p);
            }
        }
    }
    out.iter().position(|&o| !o).map(|i| i as u32)
}

/// The moves from the start to world `index`, as a numbered list.
fn trace(
    config: &Config,
    parents: &[(u32, u16)],
    index: u32,
    _last: Option<Move>,
    why: &str,
) -> String {
    let mut path = Vec::new();
    let mut i = index;
    while parents[i as usize].0 != u32::MAX {
        path.push(parents[i as usize].1);
        i = parents[i as usize].0;
    }
    path.reverse();
    let mut out = format!("VIOLATION: {why}\nconfiguration: {config}\n");
    let mut world = World::new(config);
    for (n, k) in path.into_iter().enumerate() {
        let successors = world
            .successors(config)
            .expect("a world on the way to a violation has successors");
        let (step, next) = successors
            .into_iter()
            .nth(k as usize)
            .expect("the recorded successor exists");
        out.push_str(&format!("{:>3}. {step}\n", n + 1));
        world = next;
    }
    out
}

/// The configurations of a bounded run: every class (with and without
/// `verify` for the journal class, both commit durabilities where
/// allowed), budgets of 1 to 3 attempts, a journal of one process and
/// one shared by two, crashes, faults and an operator.
pub fn configs(max_attempts: u32) -> Vec<Config> {
    let mut out = Vec::new();
    let tools: &[(Class, bool, Durability)] = &[
        (Class::Provider, false, Durability::Immediate),
        (Class::Provider, false, Durability::Eventual),
        (Class::Journal, true, Durability::Immediate),
        (Class::Journal, true, Durability::Eventual),
        (Class::Journal, false, Durability::Immediate),
        (Class::AtMostOnce, false, Durability::Immediate),
    ];
    for &(class, verify, commit) in tools {
        for attempts in 1..=max_attempts {
            for sharing in [Sharing::Local, Sharing::Shared] {
                out.push(Config {
                    policy: Config::tool(class, attempts, verify, commit),
                    sharing,
                    calls: 3,
                    crashes: 1,
                    faults: 1,
                    resolutions: 1,
                    approval: false,
                });
            }
        }
    }
    // Every call needs a person's approval: the operator approves or
    // refuses (or resolves what follows), calls return at once or wait.
    for &(class, verify, commit) in tools {
        for wait in [0, 20] {
            for sharing in [Sharing::Local, Sharing::Shared] {
                let mut policy = Config::tool(class, max_attempts.min(2), verify, commit);
                policy.approval_wait_ms = wait;
                out.push(Config {
                    policy,
                    sharing,
                    calls: 3,
                    crashes: 1,
                    faults: 1,
                    resolutions: 2,
                    approval: true,
                });
            }
        }
    }
    out
}

/// Two calls of one key and nothing else going wrong (no crash, fault or
/// operator), for every class, in one process and in two: a space small
/// enough to explore [`LEAN_EXTRA`] moves deeper, where one call's whole
/// decision (with a retry) fits before the other's.
pub fn lean_configs(max_attempts: u32) -> Vec<Config> {
    configs(max_attempts)
        .into_iter()
        .filter(|c| !c.approval && c.policy.retry.max_attempts == max_attempts.min(2))
        .map(|c| Config {
            calls: 2,
            crashes: 0,
            faults: 0,
            resolutions: 0,
            approval: false,
            ..c
        })
        .collect()
}

/// How much deeper [`lean_configs`] are explored than the others.
pub const LEAN_EXTRA: usize = 6;

/// Explores every configuration of [`configs`] to `depth`, and those of
/// [`lean_configs`] to `depth + LEAN_EXTRA`.
pub fn run(max_attempts: u32, depth: usize) -> Report {
    let mut report = Report::default();
    let all = configs(max_attempts).into_iter().map(|c| (c, depth)).chain(
        lean_configs(max_attempts)
            .into_iter()
            .map(|c| (c, depth + LEAN_EXTRA)),
    );
    for (config, depth) in all {
        explore(&config, depth, &mut report);
        if report.violations.len() >= 5 {
            break;
        }
    }
    report
}
