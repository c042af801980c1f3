//! Sagas for the operator tests: a trip books a hotel room, then is
//! aborted for a reason the test gives; the room's cancellation is refused
//! by a hotel that keeps the deposit, which escalates the saga for good.

#![allow(dead_code)]

use idem::{tool, Classify, Ctx, Failure, ToolError};
use serde::{Deserialize, Serialize};

/// A hotel's refusal.
#[derive(Debug)]
pub struct Refused(pub String);

impl Classify for Refused {
    fn classify(&self) -> Failure {
        Failure::Semantic
    }
}

/// A booked room.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Room {
    pub id: String,
}

/// Books trip `trip`'s room; `cancellable`: whether the hotel takes a
/// cancellation.
#[tool(class = "provider", key = "trip", compensate = cancel_room)]
pub async fn book_room(ctx: &Ctx, trip: u64, cancellable: bool) -> Result<Room, Refused> {
    let _ = (ctx, cancellable);
    Ok(Room {
        id: format!("room-{trip}"),
    })
}

/// Cancels a room, unless its hotel keeps the deposit.
#[tool(class = "provider", key = "room.id")]
pub async fn cancel_room(
    ctx: &Ctx,
    room: &Room,
    trip: &u64,
    cancellable: &bool,
) -> Result<String, Refused> {
    let _ = (ctx, trip);
    if !*cancellable {
        return Err(Refused("the hotel keeps the deposit".into()));
    }
    Ok(format!("cancelled {}", room.id))
}

/// The trip saga: book the room, then abort with `abort` when given.
pub async fn trip(
    ctx: &Ctx,
    trip: u64,
    cancellable: bool,
    abort: Option<&str>,
) -> Result<String, ToolError<Refused>> {
    ctx.saga("trip", |s| async move {
        let room = book_room(s.ctx(), trip, cancellable).await?;
        if let Some(why) = abort {
            return Err(s.abort(why));
        }
        Ok(room.id)
    })
    .await
}

/// Books trip `trip`'s suite, whose cancellation needs a person's approval.
#[tool(class = "provider", key = "trip", compensate = cancel_suite)]
pub async fn book_suite(ctx: &Ctx, trip: u64) -> Result<Room, Refused> {
    let _ = ctx;
    Ok(Room {
        id: format!("suite-{trip}"),
    })
}

/// Cancels a suite, once a person approves it.
#[tool(class = "provider", key = "room.id", approve = "always")]
pub async fn cancel_suite(ctx: &Ctx, room: &Room) -> Result<String, Refused> {
    let _ = ctx;
    Ok(format!("cancelled {}", room.id))
}

/// The suite saga: book the suite, then abort. Its rollback waits for the
/// cancellation's approval, so the saga escalates for now.
pub async fn suite(ctx: &Ctx, trip: u64) -> Result<String, ToolError<Refused>> {
    ctx.saga("suite", |s| async move {
        book_suite(s.ctx(), trip).await?;
        Err(s.abort("the guest left early"))
    })
    .await
}
