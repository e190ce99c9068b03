-- +goose Up
-- Instances can run inside a reservation's capacity: each takes one unit
-- (one booking of the reservation) instead of a booking of its own; a unit
-- holds at most one live instance.
ALTER TABLE instances
    ADD COLUMN reservation_id text REFERENCES reservations (reservation_id),
    ADD COLUMN reservation_booking_id text;

CREATE UNIQUE INDEX instances_reservation_unit_idx ON instances (reservation_booking_id)
    WHERE reservation_booking_id IS NOT NULL AND desired_state <> 'deleted';
CREATE INDEX instances_reservation_idx ON instances (reservation_id) WHERE reservation_id IS NOT NULL AND desired_state <> 'deleted';

-- +goose Down
DROP INDEX instances_reservation_idx;
DROP INDEX instances_reservation_unit_idx;
ALTER TABLE instances DROP COLUMN reservation_booking_id, DROP COLUMN reservation_id;
