//! The checks of what commands cause beyond their events: timers, outbox messages, the saga (5-7 of the module docs).

use super::*;

/// The timer checks (7 of the module docs) on the orders' replay.
pub(super) fn check_timers(
    orders: &Replayed<Order>,
    recorded: &Recorded,
    now_ms: u64,
    violations: &mut Vec<String>,
    unsettled: &mut Vec<String>,
    report: &mut Report,
) {
    let mut due: HashMap<(&str, &str, u64), u64> = HashMap::new();
    let mut fired: BTreeMap<(&str, &str, u64), Vec<u64>> = BTreeMap::new();
    for record in &recorded.journal {
        let RecordKind::Timer {
            entity,
            name,
            command_seq,
            op,
        } = &record.kind
        else {
            continue;
        };
        match op {
            TimerOp::Set { due_ms } => {
                if let Some(seq) = command_seq {
                    due.insert((entity, name, *seq), *due_ms);
                }
            }
            TimerOp::Fired { set_seq } => fired
                .entry((entity, name, *set_seq))
                .or_default()
                .push(record.seq),
            TimerOp::Cancel => {}
        }
    }
    for ((entity, name, set_seq), records) in fired {
        if records.len() > 1 {
            violations.push(format!(
                "the timer {name:?} of order {entity} set by command {set_seq} fired {} times (journal records {records:?})",
                records.len()
            ));
        }
    }
    let mut timers = orders.timers.clone();
    for ((entity, name), set_seq) in &orders.armed {
        let Some(due_ms) = due.get(&(entity.as_str(), name.as_str(), *set_seq)) else {
            unsettled.push(format!(
                "the timer {name:?} of order {entity} set by command {set_seq} has no set record (yet)"
            ));
            continue;
        };
        if *due_ms <= now_ms {
            unsettled.push(format!(
                "the timer {name:?} of order {entity} set by command {set_seq} was due {} ms ago and has not fired",
                now_ms - due_ms
            ));
        }
        timers.armed_due_ms.push(*due_ms);
    }
    timers.armed_due_ms.sort_unstable();
    report.timers = timers;
}

/// The messages a model decided: (command seq, index within the command, message).
pub(super) type Sent = Vec<(u64, usize, Message)>;

/// The outbox check (5 of the module docs): `sources` are each entity type with the messages
/// its model sent and its own streams (where the messages to it are stored). Returns how many
/// messages were stored more than once.
pub(super) fn check_outbox(
    sources: &[(&str, &Sent, &Recorded)],
    violations: &mut Vec<String>,
    unsettled: &mut Vec<String>,
) -> usize {
    // Every stored command that came from an outbox, by its msg id.
    let mut stored: HashMap<&str, Vec<(&str, &StoredCommand)>> = HashMap::new();
    for (t, _, recorded) in sources {
        for command in &recorded.commands {
            if let Some(id) = command.msg_id.as_deref().filter(|id| is_outbox_msg_id(id)) {
                stored.entry(id).or_default().push((t, command));
            }
        }
    }
    let mut stored_again = 0;
    for (t, sent, _) in sources {
        for (seq, index, message) in sent.iter() {
            let msg_id = format!("{t}:{seq}:out:{index}");
            let Some(copies) = stored.remove(msg_id.as_str()) else {
                unsettled.push(format!(
                    "message {index} of {t} command {seq} (to {} {}) is not stored",
                    message.entity_type(),
                    message.id()
                ));
                continue;
            };
            stored_again += copies.len() - 1;
            for (target, command) in copies {
                if target != message.entity_type()
                    || command.entity != message.id()
                    || command.payload[..] != message.body()[..]
                {
                    violations.push(format!(
                        "{target} command {} of {} ({msg_id}) is not the message {t} command {seq} sent: {message:?}",
                        command.seq, command.entity
                    ));
                }
            }
        }
    }
    let mut phantoms: Vec<_> = stored.into_iter().collect();
    phantoms.sort_by_key(|(id, _)| *id);
    for (msg_id, copies) in phantoms {
        for (target, command) in copies {
            violations.push(format!(
                "{target} command {} of {} claims to be outbox message {msg_id}, which no command sent",
                command.seq, command.entity
            ));
        }
    }
    stored_again
}

/// `<t>:<seq>:out:<i>`.
pub(super) fn is_outbox_msg_id(id: &str) -> bool {
    let parts: Vec<&str> = id.split(':').collect();
    matches!(parts[..], [_, seq, "out", index] if seq.parse::<u64>().is_ok() && index.parse::<u64>().is_ok())
}

/// The saga checks (6 of the module docs), on the models' end states.
pub(super) fn check_saga(
    orders: &BTreeMap<String, OrderState>,
    products: &BTreeMap<String, InventoryState>,
    inventory: &Recorded,
    violations: &mut Vec<String>,
    unsettled: &mut Vec<String>,
) {
    // No line reserved twice, by the journal as written.
    let mut reserved: BTreeMap<(String, u32), Vec<(u64, String)>> = BTreeMap::new();
    for record in &inventory.journal {
        if let RecordKind::Event {
            entity, payload, ..
        } = &record.kind
            && let Ok(InventoryEvent::Reserved { order, line, .. }) = Codec::Json.decode(payload)
        {
            reserved
                .entry((order, line))
                .or_default()
                .push((record.seq, entity.clone()));
        }
    }
    for ((order, line), records) in &reserved {
        if records.len() > 1 {
            violations.push(format!(
                "line {line} of order {order} was reserved {} times (inventory journal records {records:?})",
                records.len()
            ));
        }
    }
    // Every item answered; the holds are the reserved items of the orders still standing.
    let mut expected: BTreeMap<(String, u32), (String, u32)> = BTreeMap::new();
    for (id, order) in orders {
        for (line, item) in (0u32..).zip(&order.items) {
            if item.stock == Stock::Unconfirmed {
                unsettled.push(format!(
                    "line {line} of order {id} ({}) has no answer from the inventory",
                    item.sku
                ));
            }
        }
        if order.phase != Phase::Cancelled {
            for (line, item) in order.reserved() {
                expected.insert((id.clone(), line), (item.sku.clone(), item.qty));
            }
        }
    }
    for (sku, product) in products {
        let held: u32 = product.holds.iter().map(|h| h.qty).sum();
        if held > STOCK {
            violations.push(format!(
                "{sku} holds {held} units, more than its stock of {STOCK}"
            ));
        }
        for hold in &product.holds {
            let key = (hold.order.clone(), hold.line);
            match expected.remove(&key) {
                Some((want_sku, qty)) if want_sku == *sku && qty == hold.qty => {}
                Some(want) => violations.push(format!(
                    "{sku} holds {} of line {} of order {}, which reserved {want:?}",
                    hold.qty, hold.line, hold.order
                )),
                None => unsettled.push(format!(
                    "{sku} holds {} for line {} of order {}, which is cancelled or holds no such line: not released",
                    hold.qty, hold.line, hold.order
                )),
            }
        }
    }
    for ((order, line), (sku, qty)) in expected {
        unsettled.push(format!(
            "line {line} of order {order} is reserved ({qty} of {sku}), but {sku} does not hold it: lost"
        ));
    }
}
