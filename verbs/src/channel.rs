//! Completion channels: one fd for many CQs (`ibv_create_comp_channel`, `ibv_get_cq_event`,
//! `ibv_ack_cq_events`). OWNER: helper "memcq".
