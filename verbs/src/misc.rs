//! The small exported helpers: strings (`ibv_wc_status_str`, …), rates, fork support.
//! OWNER: helper "device".
