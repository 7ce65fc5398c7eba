"""jobkit: a Supabase-native job queue on one Postgres table."""
