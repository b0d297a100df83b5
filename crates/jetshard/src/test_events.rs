//! Test support: a tracing subscriber that records every event, for tests of what the library
//! logs (an event's name, level and fields are part of what operators grep for).

use std::sync::{Arc, Mutex, PoisonError};

/// One recorded event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Event {
    pub(crate) level: tracing::Level,
    pub(crate) target: String,
    /// The event's message (its `message` field, as `Debug` prints it).
    pub(crate) message: String,
    /// Its other fields in order, each as `Debug` prints its value.
    pub(crate) fields: Vec<(String, String)>,
}

/// Records every event while it is the default subscriber
/// (`tracing::subscriber::with_default(recorder.clone(), ..)`).
#[derive(Debug, Clone, Default)]
pub(crate) struct Recorder(Arc<Mutex<Vec<Event>>>);

impl Recorder {
    /// The events recorded so far, in order.
    pub(crate) fn events(&self) -> Vec<Event> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

struct Fields(Vec<(String, String)>);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }
}

impl tracing::Subscriber for Recorder {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        let mut fields = Fields(Vec::new());
        event.record(&mut fields);
        let message = fields
            .0
            .iter()
            .find(|(name, _)| name == "message")
            .map(|(_, value)| value.clone())
            .unwrap_or_default();
        fields.0.retain(|(name, _)| name != "message");
        let meta = event.metadata();
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Event {
                level: *meta.level(),
                target: meta.target().to_owned(),
                message,
                fields: fields.0,
            });
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}
