//! Memory regions registered in place (`ibv_reg_mr`, `ibv_reg_mr_iova2`, `ibv_rereg_mr`,
//! `ibv_dereg_mr`). OWNER: helper "memcq".
