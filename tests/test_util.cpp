// Shared helpers for the castor_tests binary (this branch has none yet).
