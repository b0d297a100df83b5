//! What each owner and crash watch does next, and how an action changes the state.

use crate::state::bit;
use crate::*;

pub(crate) fn deliver(part: &mut Partition, c: u8, (process, pin): (u8, u8)) {
    let cmd = &mut part.commands[c as usize];
    cmd.delivery = Delivery::InHand { process, pin };
    cmd.delivered += 1;
    cmd.in_hand += 1;
}

/// What an owner does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OwnerStep {
    /// Read the latest fence record (`fence::latest`).
    ReadFence,
    /// Publish the claim, expecting the sequence read (`fence::claim`).
    Claim,
    /// A write was fenced (or the pin moved: `Action::PinLost`): step down, refusing the pin.
    StepDown,
    /// Run the head command: write its events (or its dead letter), or nak it.
    Run(u8),
    /// Acknowledge (or terminate) the head command, its records stored.
    Settle(u8),
    /// Hand-off: nothing in flight, unpin and cool down.
    Unpin,
    /// Cool-down over.
    Rejoin,
}

/// What a crash watch does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WatchStep {
    /// The latest claim names a dead process whose pin holds.
    Found(u8),
    /// Store the unpin record of that claim (deduplicated by its sequence).
    StoreRecord(u8),
    /// Unpin.
    Unpin(u8),
}

impl Ownership {
    pub(crate) fn owner_step(&self, s: &State, q: u8, p: u8) -> Option<OwnerStep> {
        let part = &s.partitions[p as usize];
        let owner = &s.processes[q as usize].owners[p as usize];
        match owner.phase {
            // Pinned, a standby acquires at once (see `Action::Pin`); a refused pin lapses.
            Phase::Standby | Phase::Refused { .. } => None,
            Phase::Acquiring { read: None, .. } => Some(OwnerStep::ReadFence),
            Phase::Acquiring { read: Some(_), .. } => Some(OwnerStep::Claim),
            Phase::CoolingDown => Some(OwnerStep::Rejoin),
            Phase::Releasing { pin, .. } => {
                (!owner.writing || part.pin != Some((q, pin))).then_some(OwnerStep::Unpin)
            }
            Phase::Owning { pin, seq, .. } => {
                // A refused write tells at once; a moved pin only at the next pull (`PinLost`):
                // until then the owner runs what it has in hand.
                if owner.fenced {
                    return Some(OwnerStep::StepDown);
                }
                if owner.writing {
                    return None;
                }
                let head =
                    part.commands.iter().position(|c| {
                        !matches!(c.delivery, Delivery::Acked | Delivery::Terminated)
                    })? as u8;
                let cmd = &part.commands[head as usize];
                if cmd.delivered == 0 {
                    return None;
                }
                let mine = cmd.delivery == Delivery::InHand { process: q, pin };
                if owner.applied & bit(head) != 0 || owner.given_up & bit(head) != 0 {
                    // Its outcome is durable: acknowledged once it is delivered here again.
                    return mine.then_some(OwnerStep::Settle(head));
                }
                let failing = self.config.failing == Some((p, head));
                let deliveries = self.deliveries(part, head, (q, pin), seq);
                // A failing command recovered from the stream (delivered to an earlier owner)
                // waits for its redelivery here, to be counted and nak'ed, or given up.
                if failing && !mine && deliveries < self.config.max_deliver {
                    return None;
                }
                Some(OwnerStep::Run(head))
            }
        }
    }

    /// The delivery count the owner goes by: the server's count if the command was delivered to
    /// it, the claims that found it in hand (and this run) if it was recovered from the stream
    /// (`acquire::claim`: `claims_holding + 1`).
    /// `seq`: the owner's own fence record, whose counts it took at its claim.
    pub(crate) fn deliveries(&self, part: &Partition, c: u8, (q, pin): (u8, u8), seq: u8) -> u8 {
        let cmd = &part.commands[c as usize];
        let claims = part.fence[seq as usize - 1].held[c as usize].saturating_add(1);
        if cmd.delivery == (Delivery::InHand { process: q, pin }) {
            cmd.delivered.max(claims)
        } else {
            claims
        }
    }

    pub(crate) fn take_owner_step(&self, s: &mut State, q: u8, p: u8, step: OwnerStep) {
        let bugs = self.config.bugs;
        let max_deliver = self.config.max_deliver;
        let failing = self.config.failing;
        let poison = self.config.poison;
        let alive: Vec<bool> = s.processes.iter().map(|p| p.alive).collect();
        let part = &mut s.partitions[p as usize];
        let owner = &mut s.processes[q as usize].owners[p as usize];
        match step {
            OwnerStep::ReadFence => {
                if let Phase::Acquiring { pin, first_new, .. } = owner.phase {
                    owner.phase = Phase::Acquiring {
                        pin,
                        read: Some(part.latest()),
                        first_new,
                    };
                }
            }
            OwnerStep::Claim => {
                let Phase::Acquiring {
                    pin,
                    read: Some(read),
                    first_new,
                } = owner.phase
                else {
                    return;
                };
                if read != part.latest() && !bugs.claim_without_cas {
                    // Wrong last sequence: read again and retry.
                    owner.phase = Phase::Acquiring {
                        pin,
                        read: None,
                        first_new,
                    };
                    return;
                }
                let previous = read.checked_sub(1).map(|i| &part.fence[i as usize]);
                let generation = previous.map_or(0, |r| r.generation) + 1;
                // The claim counts the commands in hand once more if their owner died (the
                // probe's "no responders"; a stalled process answers nothing: not dead).
                let died = previous.is_some_and(|r| !alive[r.process as usize]);
                // Counted: the consumer's in-hand window, up to the delivery that pinned this
                // owner if that was a first one (`acquire::claim`'s `counted`).
                let commands = &part.commands;
                let counted = |i: usize| {
                    matches!(commands[i].delivery, Delivery::InHand { .. })
                        && first_new.is_none_or(|f| i < f as usize)
                };
                let held: Vec<u8> = part
                    .commands
                    .iter()
                    .enumerate()
                    .map(|(i, _)| {
                        if counted(i) {
                            previous.map_or(0, |r| r.held[i]) + u8::from(died)
                        } else {
                            0
                        }
                    })
                    .collect();
                // The warm entities are kept only by the claim of the generation after theirs
                // (`takeover.rs`): then no other generation claimed, so none wrote, since.
                let warm = owner.warm.take().filter(|w| {
                    bugs.warm_without_fence_chain || w.generation.checked_add(1) == Some(generation)
                });
                // `fence::trial`: the head of what earlier owners held, once a command was
                // counted at `isolate_at` claims; its runs count the isolated owners that died
                // with it first in hand.
                let isolate_at = max_deliver.clamp(1, 2);
                let head = (0..part.commands.len()).find(|&i| counted(i));
                let trial = head.and_then(|head| {
                    let suspect = held.iter().any(|&h| h >= isolate_at);
                    if !suspect || held[head] == 0 {
                        return None;
                    }
                    let more = u8::from(died);
                    let runs = match previous.and_then(|r| r.trial) {
                        Some((c, runs)) if c as usize == head => runs + more,
                        Some(_) => more,
                        None => 0,
                    };
                    Some((head as u8, runs))
                });
                part.fence.push(FenceRecord {
                    generation,
                    process: q,
                    pin,
                    held,
                    trial,
                    warm: warm.is_some(),
                });
                part.watch_unpins.push(0);
                let seq = part.latest();
                // The commands earlier owners held are recovered from the stream: in hand here.
                for c in &mut part.commands {
                    if matches!(c.delivery, Delivery::InHand { process, pin: id } if (process, id) != (q, pin))
                    {
                        c.in_hand += 1;
                    }
                }
                // Entities are kept warm, or loaded after the claim: what the journal holds now.
                (owner.applied, owner.given_up) = match warm {
                    Some(w) => (w.applied, w.given_up),
                    None => part.known(),
                };
                owner.writing = false;
                owner.fenced = false;
                owner.phase = Phase::Owning {
                    generation,
                    seq,
                    pin,
                };
            }
            OwnerStep::StepDown => {
                if let Phase::Owning {
                    generation, pin, ..
                } = owner.phase
                {
                    // The only step-down that may keep states warm (`StepDown::keeps_warm`): a
                    // lost pin may come straight back to this process; a fenced one keeps none.
                    owner.warm = owner.keep_warm(generation, bugs);
                    owner.phase = Phase::Refused { pin };
                    owner.writing = false;
                }
            }
            OwnerStep::Run(c) => {
                let Phase::Owning {
                    generation,
                    seq,
                    pin,
                } = owner.phase
                else {
                    return;
                };
                let deliveries = self.deliveries(part, c, (q, pin), seq);
                let mine =
                    part.commands[c as usize].delivery == Delivery::InHand { process: q, pin };
                // `settle::suspect`: the trial's command, after an isolated owner died running
                // it, past max_deliver: given up before it runs.
                let suspect = part.fence[seq as usize - 1].trial.is_some_and(|(t, runs)| {
                    t == c && runs >= ISOLATED_DEATHS && deliveries > max_deliver
                });
                if !suspect && poison == Some((p, c)) {
                    // It kills its process.
                    let proc = &mut s.processes[q as usize];
                    proc.alive = false;
                    return;
                }
                let is_failing = failing == Some((p, c)) || suspect;
                if is_failing && !suspect && deliveries < max_deliver {
                    // It failed: nak'ed, redelivered at once.
                    if mine {
                        deliver(part, c, (q, pin));
                    }
                    return;
                }
                let record = Record {
                    command: c,
                    generation,
                    process: q,
                    dead_letter: is_failing,
                };
                part.in_flight.push(Write {
                    record,
                    expects: seq,
                });
                owner.writing = true;
                if bugs.ack_before_durable && mine {
                    part.commands[c as usize].delivery = if is_failing {
                        Delivery::Terminated
                    } else {
                        Delivery::Acked
                    };
                }
            }
            OwnerStep::Settle(c) => {
                let cmd = &mut part.commands[c as usize];
                cmd.delivery = if owner.given_up & bit(c) != 0 {
                    Delivery::Terminated
                } else {
                    Delivery::Acked
                };
            }
            OwnerStep::Unpin => {
                // Nothing is kept warm (`StepDown::HandedOff` stops the actors): the process
                // cools down so that the partition goes to another one, and its claim would
                // not be the next generation after this one's.
                if let Phase::Releasing { pin, .. } = owner.phase
                    && part.pin == Some((q, pin))
                {
                    part.pin = None;
                }
                owner.phase = Phase::CoolingDown;
                owner.writing = false;
            }
            OwnerStep::Rejoin => owner.phase = Phase::Standby,
        }
    }

    pub(crate) fn watch_step(&self, s: &State, q: u8, p: u8) -> Option<WatchStep> {
        let part = &s.partitions[p as usize];
        let watch = &s.processes[q as usize].watches[p as usize];
        match watch.found {
            Some((seq, false)) => Some(WatchStep::StoreRecord(seq)),
            // Like the library, it does not look again between its check and its unpin.
            Some((seq, true)) => Some(WatchStep::Unpin(seq)),
            None => {
                let seq = part.latest();
                let record = part.fence.last()?;
                let dead = !s.processes[record.process as usize].alive;
                (seq > watch.done
                    && record.process != q
                    && dead
                    && part.pin == Some((record.process, record.pin)))
                .then_some(WatchStep::Found(seq))
            }
        }
    }
}

impl Owner {
    /// What a step-down from `Owning` under `generation` keeps warm: nothing after a fenced
    /// write (a newer generation claimed: the states may lack its writes), nothing while its
    /// own write is in doubt (it may be stored later, and the state lacks it); after a lost
    /// pin, what it knows.
    fn keep_warm(&self, generation: u8, bugs: Bugs) -> Option<Warm> {
        (!self.fenced && (!self.writing || bugs.warm_in_doubt)).then_some(Warm {
            generation,
            applied: self.applied,
            given_up: self.given_up,
        })
    }
}
