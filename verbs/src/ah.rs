//! Address handles (`ibv_create_ah`, `ibv_create_ah_from_wc`, `ibv_init_ah_from_wc`,
//! `ibv_destroy_ah`). OWNER: helper "qp".
