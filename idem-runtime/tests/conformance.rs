//! The backend conformance suite (`idem_testkit::conformance`), run against
//! every journal: the in-memory model without and with leases, sled, and
//! PostgreSQL (a throwaway server this test binary starts and stops).

mod memory {
    idem_testkit::conformance_suite!(idem_testkit::conformance::mem());
}

mod memory_with_leases {
    idem_testkit::conformance_suite!(idem_testkit::conformance::mem_with_leases(), leases);
}

mod sled {
    idem_testkit::conformance_suite!(idem_testkit::conformance::sled());
}

mod postgres {
    idem_testkit::conformance_suite!(idem_testkit::conformance::postgres(), leases);
}
