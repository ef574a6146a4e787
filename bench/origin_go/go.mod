module keybus/bench/origin_go

go 1.19
