//! The crash matrix of `idem::testing` on this crate's own tool.

use idem::testing::{CrashMatrix, CrashPoint, Ledger, Violation};
use idem_downstream_example::{refund, FakePayments};

/// The fake's ledger, for the matrix.
struct Payments(FakePayments);

impl Ledger for Payments {
    fn effects(&self) -> usize {
        self.0.refunds_made()
    }
}

#[tokio::test(start_paused = true)]
async fn refund_is_made_once_whatever_the_crash() {
    let report = CrashMatrix::new("refund")
        .unwrap()
        .run(
            || Payments(FakePayments::new()),
            async |p, ctx| refund(ctx, p.0.clone(), 4711, 500).await,
        )
        .await;
    println!("{report}");
    report.assert_holds();
}

#[tokio::test(start_paused = true)]
async fn the_matrix_catches_a_provider_that_does_not_deduplicate() {
    let report = CrashMatrix::new("refund")
        .unwrap()
        .run(
            || Payments(FakePayments::without_dedupe()),
            async |p, ctx| refund(ctx, p.0.clone(), 4711, 500).await,
        )
        .await;
    println!("{report}");
    let broken: Vec<_> = report.violations().map(|p| p.point).collect();
    assert_eq!(broken, [CrashPoint::AfterProvider]);
    let p = report.point(CrashPoint::AfterProvider).unwrap();
    assert!(matches!(
        p.violation,
        Some(Violation::Duplicated { count: 2 })
    ));
}
