//! Which agent posts a transfer and how its notification travels: pure
//! functions over named states, so the whole policy reads on one screen and
//! is tested without NIXL.
//!
//! Why notifications go apart, and why the first transfers to a peer take
//! the proving route: docs/decisions/0004-notification-apart-and-proving-route.md.

use crate::tuning::Notifications;

/// What the serving agent holds for a peer, so that it can send the
/// notifications of transfers to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Notifier {
    /// The serving agent was never asked to load the peer.
    NotLoaded,
    /// The serving agent could not load the peer (the peer is this
    /// connector, say): its transfers carry their notification.
    LoadFailed,
    /// Loaded; no transfer through the serving agent with its notification
    /// attached has succeeded yet, so its endpoint to the peer may still
    /// wait for its handshake.
    Proving,
    /// One such transfer succeeded: the serving agent's endpoint to the
    /// peer is connected, and a notification sent apart leaves at once.
    Proven,
}

/// The agent that posts a transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Poster {
    /// The initiating agent (the serving one itself when NIXL's thread is
    /// off: there is one agent).
    Initiating,
    /// The serving agent.
    Serving,
}

/// How one transfer goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// No notification: through the initiating agent.
    Silent,
    /// Through the initiating agent, carrying its notification.
    Attached,
    /// Through the serving agent, carrying its notification; its success
    /// proves the serving agent's endpoint to the peer
    /// ([`Notifier::Proven`]).
    Proving,
    /// Through the initiating agent; the serving agent sends the
    /// notification once NIXL reports the transfer done.
    Apart,
}

impl Route {
    /// The agent that posts the transfer.
    pub(crate) fn poster(self) -> Poster {
        match self {
            Route::Proving => Poster::Serving,
            Route::Silent | Route::Attached | Route::Apart => Poster::Initiating,
        }
    }

    /// Whether NIXL carries the notification with the transfer.
    pub(crate) fn attaches(self) -> bool {
        matches!(self, Route::Attached | Route::Proving)
    }
}

/// The route of a transfer that does (`notifies`) or does not notify its
/// peer, under the builder's setting and what the serving agent holds for
/// the peer.
pub(crate) fn plan(notifies: bool, setting: Notifications, notifier: Notifier) -> Route {
    match (notifies, setting, notifier) {
        (false, _, _) => Route::Silent,
        (true, Notifications::Attached, _) => Route::Attached,
        (true, Notifications::Apart, Notifier::NotLoaded | Notifier::LoadFailed) => Route::Attached,
        (true, Notifications::Apart, Notifier::Proving) => Route::Proving,
        (true, Notifications::Apart, Notifier::Proven) => Route::Apart,
    }
}

/// Whether a peer's metadata, just loaded into the initiating agent, is
/// also loaded into the serving agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotifierLoad {
    /// Not loaded there: notifications are attached (by setting, or because
    /// the peer is this agent), the serving agent could not load it, or it
    /// holds the peer and needs no more regions (proven: it posts nothing).
    Skip,
    /// Loaded there: a failure leaves the peer [`Notifier::LoadFailed`].
    First,
    /// Loaded there again, for the new regions the proving route posts to;
    /// a failure leaves the peer as it was (a transfer the serving agent
    /// cannot post goes through the initiating one).
    More,
}

/// Whether to load the peer into the serving agent. `own` is true when the
/// peer is this agent (an agent cannot load itself as a peer).
pub(crate) fn notifier_load(setting: Notifications, own: bool, notifier: Notifier) -> NotifierLoad {
    match (setting, own, notifier) {
        (Notifications::Attached, _, _) | (_, true, _) => NotifierLoad::Skip,
        (Notifications::Apart, false, Notifier::NotLoaded) => NotifierLoad::First,
        (Notifications::Apart, false, Notifier::Proving) => NotifierLoad::More,
        (Notifications::Apart, false, Notifier::LoadFailed | Notifier::Proven) => {
            NotifierLoad::Skip
        }
    }
}

/// How the serving agent's load of a peer went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LoadOutcome {
    /// NIXL took the metadata.
    Loaded,
    /// NIXL refused it; `held` tells whether it still holds the peer (if
    /// not, it may keep the connection: the name is poisoned).
    Refused { held: bool },
}

/// A peer's notifier state after a load into the serving agent.
pub(crate) fn after_load(before: Notifier, outcome: LoadOutcome) -> Notifier {
    match (before, outcome) {
        (Notifier::NotLoaded | Notifier::LoadFailed, LoadOutcome::Loaded) => Notifier::Proving,
        (Notifier::NotLoaded, LoadOutcome::Refused { .. })
        | (_, LoadOutcome::Refused { held: false }) => Notifier::LoadFailed,
        (kept, _) => kept,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    use Notifications::{Apart, Attached as AttachedSetting};
    use Notifier::{LoadFailed, NotLoaded, Proven, Proving};

    #[rstest]
    #[case::no_notification_not_loaded(false, Apart, NotLoaded, Route::Silent)]
    #[case::no_notification_load_failed(false, Apart, LoadFailed, Route::Silent)]
    #[case::no_notification_proving(false, Apart, Proving, Route::Silent)]
    #[case::no_notification_proven(false, Apart, Proven, Route::Silent)]
    #[case::no_notification_attached_setting(false, AttachedSetting, Proven, Route::Silent)]
    #[case::apart_peer_not_in_serving_agent_attaches(true, Apart, NotLoaded, Route::Attached)]
    #[case::apart_serving_agent_refused_the_peer_attaches(true, Apart, LoadFailed, Route::Attached)]
    #[case::apart_unproven_endpoint_takes_the_proving_route(true, Apart, Proving, Route::Proving)]
    #[case::apart_proven_endpoint_sends_apart(true, Apart, Proven, Route::Apart)]
    #[case::attached_setting_not_loaded(true, AttachedSetting, NotLoaded, Route::Attached)]
    #[case::attached_setting_load_failed(true, AttachedSetting, LoadFailed, Route::Attached)]
    #[case::attached_setting_proving(true, AttachedSetting, Proving, Route::Attached)]
    #[case::attached_setting_proven(true, AttachedSetting, Proven, Route::Attached)]
    fn plan_routes_by_setting_and_notifier(
        #[case] notifies: bool,
        #[case] setting: Notifications,
        #[case] notifier: Notifier,
        #[case] route: Route,
    ) {
        assert_eq!(plan(notifies, setting, notifier), route);
    }

    #[rstest]
    #[case::silent(Route::Silent, Poster::Initiating, false)]
    #[case::attached(Route::Attached, Poster::Initiating, true)]
    #[case::proving(Route::Proving, Poster::Serving, true)]
    #[case::apart(Route::Apart, Poster::Initiating, false)]
    fn a_route_names_its_poster_and_whether_nixl_carries_the_notification(
        #[case] route: Route,
        #[case] poster: Poster,
        #[case] attaches: bool,
    ) {
        assert_eq!((route.poster(), route.attaches()), (poster, attaches));
    }

    #[rstest]
    #[case::first_load(Apart, false, NotLoaded, NotifierLoad::First)]
    #[case::more_regions_while_proving(Apart, false, Proving, NotifierLoad::More)]
    #[case::proven_needs_no_regions(Apart, false, Proven, NotifierLoad::Skip)]
    #[case::refused_before_is_not_retried(Apart, false, LoadFailed, NotifierLoad::Skip)]
    #[case::own_agent_not_loaded(Apart, true, NotLoaded, NotifierLoad::Skip)]
    #[case::own_agent_proving(Apart, true, Proving, NotifierLoad::Skip)]
    #[case::attached_setting_never_loads(AttachedSetting, false, NotLoaded, NotifierLoad::Skip)]
    #[case::attached_setting_proving(AttachedSetting, false, Proving, NotifierLoad::Skip)]
    fn the_serving_agent_loads_a_peer_only_while_it_proves_its_endpoint(
        #[case] setting: Notifications,
        #[case] own: bool,
        #[case] notifier: Notifier,
        #[case] load: NotifierLoad,
    ) {
        assert_eq!(notifier_load(setting, own, notifier), load);
    }

    const HELD: LoadOutcome = LoadOutcome::Refused { held: true };
    const DROPPED: LoadOutcome = LoadOutcome::Refused { held: false };

    #[rstest]
    #[case::loaded_first(NotLoaded, LoadOutcome::Loaded, Proving)]
    #[case::loaded_after_a_failure(LoadFailed, LoadOutcome::Loaded, Proving)]
    #[case::more_regions_keep_proving(Proving, LoadOutcome::Loaded, Proving)]
    #[case::loaded_when_proven_stays_proven(Proven, LoadOutcome::Loaded, Proven)]
    #[case::first_refusal_fails(NotLoaded, HELD, LoadFailed)]
    #[case::first_refusal_dropped_fails(NotLoaded, DROPPED, LoadFailed)]
    #[case::refused_more_regions_keeps_proving(Proving, HELD, Proving)]
    #[case::dropped_while_proving_fails(Proving, DROPPED, LoadFailed)]
    #[case::dropped_when_proven_fails(Proven, DROPPED, LoadFailed)]
    #[case::refused_when_proven_stays_proven(Proven, HELD, Proven)]
    #[case::refused_after_a_failure_stays_failed(LoadFailed, HELD, LoadFailed)]
    #[case::dropped_after_a_failure_stays_failed(LoadFailed, DROPPED, LoadFailed)]
    fn a_load_moves_the_notifier(
        #[case] before: Notifier,
        #[case] outcome: LoadOutcome,
        #[case] after: Notifier,
    ) {
        assert_eq!(after_load(before, outcome), after);
    }
}
