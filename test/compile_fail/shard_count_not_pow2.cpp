// expect: make the shard count a power of two
#include <tide/policy/mix_hash.hpp>
constexpr auto kShards = tide::static_shard_count<tide::policy::mix_hash, 12>::value;
int main() { return static_cast<int>(kShards); }
