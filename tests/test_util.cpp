// Shared helpers for the castor_tests binary (none yet).
